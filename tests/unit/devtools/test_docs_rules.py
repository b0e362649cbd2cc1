"""The rule index (devtools/devstack, gpufleet_devstack.rules): docstrings that cite a rule,
PRODUCT.md's titles, and the staleness check that only looks at the citations."""

from __future__ import annotations

from pathlib import Path

import pytest
from gpufleet_devstack import rules
from gpufleet_devstack.rules import Rule

PRODUCT = """# rules

## 1. Tenancy
- R-TEN-1 An **account** owns projects, providers and a credit balance. Every job
  belongs to a **project**.
- R-TEN-3 Feature plans: `free`, `team`, `enterprise`. Regional resources need `team`.
- R-BILL-4 Earning: when your node serves another account's job, that customer pays the full
  GPU-hour price; the rest.
- R-REG-1 Physical region: `name` (unique per account; DNS-hostname characters), `storage_mode`
  `local` (default) or `central`, `allow_public_jobs` (default false), and then a great deal more
  words so that the title has to be shortened somewhere.

Not a rule: R-TEN-2 in running text.
"""


def _tree(root: Path) -> None:
    src = root / "libs" / "thing" / "src" / "gpufleet_thing"
    src.mkdir(parents=True)
    (src / "__init__.py").write_text('"""The thing (R-TEN-1)."""\n')
    (src / "fees.py").write_text(
        '"""No rule here."""\n\n'
        "# R-BILL-9: a comment does not count\n"
        "def charge() -> None:\n"
        '    """Charges the owner (R-BILL-4, R-TEN-1)."""\n\n'
        "class Ledger:\n"
        '    """A ledger."""\n\n'
        "    async def post(self) -> None:\n"
        '        """Posts an entry (R-BILL-4)."""\n\n'
        "        def inner() -> None:\n"
        '            """R-TEN-3."""\n'
    )
    app = root / "services" / "svc" / "src" / "gpufleet_svc"
    app.mkdir(parents=True)
    (app / "app.py").write_text('x = "R-TEN-1 in a string is not a docstring"\n')


def test_citations_name_the_module_class_and_function(tmp_path: Path) -> None:
    _tree(tmp_path)
    assert rules.citations(tmp_path) == {
        Rule("TEN", 1): {"gpufleet_thing", "gpufleet_thing.fees:charge"},
        Rule("BILL", 4): {"gpufleet_thing.fees:charge", "gpufleet_thing.fees:Ledger.post"},
        Rule("TEN", 3): {"gpufleet_thing.fees:Ledger.post.inner"},
    }


def test_titles_are_the_first_sentence_of_each_rule() -> None:
    titles = rules.product_titles(PRODUCT)
    assert titles[Rule("TEN", 1)] == ("An account owns projects, providers and a credit balance")
    # a short clause before a colon is not a title; one inside `code` or ( ) is not an end
    assert titles[Rule("TEN", 3)] == "Feature plans: `free`, `team`, `enterprise`"
    assert titles[Rule("BILL", 4)] == (
        "Earning: when your node serves another account's job, that customer pays the full "
        "GPU-hour price"
    )
    long = titles[Rule("REG", 1)]
    assert long.endswith("…") and len(long) <= rules.TITLE_MAX and long.count("`") % 2 == 0
    assert long.startswith("Physical region: `name` (unique per account; DNS-hostname")
    assert Rule("TEN", 2) not in titles


def test_the_index_lists_rules_in_order_and_keeps_its_titles(tmp_path: Path) -> None:
    _tree(tmp_path)
    titles = rules.product_titles(PRODUCT)
    text = rules.markdown(rules.citations(tmp_path), titles)
    assert text.index("**R-BILL-4**") < text.index("**R-TEN-1**") < text.index("**R-TEN-3**")
    assert "  - `gpufleet_thing.fees:Ledger.post`\n" in text
    assert rules.titles_in_index(text) == {
        r: t for r, t in titles.items() if r in rules.citations(tmp_path)
    }


def test_rule_order_is_numeric() -> None:
    assert sorted([Rule.parse("R-JOB-10"), Rule.parse("R-JOB-2")]) == [
        Rule("JOB", 2),
        Rule("JOB", 10),
    ]
    with pytest.raises(ValueError):
        Rule.parse("R-job-1")


def test_without_product_md_the_titles_already_written_are_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _tree(tmp_path)
    product = tmp_path / "PRODUCT.md"
    product.write_text(PRODUCT)
    monkeypatch.setenv("GPUFLEET_PRODUCT_MD", str(product))
    written = rules.render(tmp_path, None)
    assert "**R-TEN-1** An account owns projects" in written

    # The check reads no PRODUCT.md: a changed rule text does not make the index stale ...
    product.write_text(PRODUCT.replace("An **account** owns", "A **tenant** owns"))
    assert rules.render(tmp_path, written, read_product=False) == written
    # ... and neither does a missing one, when the index is written again.
    monkeypatch.setenv("GPUFLEET_PRODUCT_MD", str(tmp_path / "missing.md"))
    assert rules.render(tmp_path, written) == written

    # A docstring that cites another rule does.
    fees = tmp_path / "libs" / "thing" / "src" / "gpufleet_thing" / "fees.py"
    fees.write_text(fees.read_text().replace("(R-BILL-4, R-TEN-1)", "(R-BILL-4)"))
    stale = rules.render(tmp_path, written, read_product=False)
    assert written.count("`gpufleet_thing.fees:charge`") == 2  # under R-BILL-4 and R-TEN-1
    assert stale.count("`gpufleet_thing.fees:charge`") == 1
