"""The node's fetchers and uploaders, built from its settings: one per kind of location it
can reach (s3, gcs, azure, web, git), all behind one address guard, the object stores', the
web's and git's through the node's content cache (cache.py) unless its budget is 0; `platform`
(platform.py) and `local` (local.py: relayed through the platform's store) when the agent
gives it a way to ask the scheduler (`request`: always in production; unit tests may build
the registries without a bus). `datastore` (datastores.py), in and out: under the root the
operator gave the datastore on this node (GPUFLEET_REGIONAL_DATASTORES). Each one's bytes are
counted on `tally` (tally.py) when one is given: the agent's."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from ..settings import AgentSettings
from .azure import Azure
from .cache import ContentCache, Versioned
from .datastores import Datastores, parse_roots
from .gcs import Gcs
from .git import Git
from .guard import AddressGuard
from .local import LocalRelay
from .platform import Platform, Requester, quiet_http_logs
from .registry import Fetcher, Fetchers, Uploaders
from .s3 import S3
from .tally import TransferTally
from .web import Web


def node_staging(
    settings: AgentSettings,
    request: Requester | None = None,
    roots: Mapping[str, Path] | None = None,
    tally: TransferTally | None = None,
) -> tuple[Fetchers, Uploaders]:
    """`roots`: the datastores' roots as the node's keeper has them (mounts/keeper.py), read
    live; by default the operator's (GPUFLEET_REGIONAL_DATASTORES)."""
    guard = AddressGuard.of(settings.staging_allow.split(","))
    ca = settings.staging_ca_file
    s3, gcs, azure = S3(guard, ca), Gcs(guard, settings.staging_gcs_endpoint), Azure(guard, ca)
    web, git = Web(guard, ca), Git(guard, ca)
    if roots is None:
        roots = parse_roots(settings.regional_datastores)
    datastores = Datastores(roots, settings.region)
    budget = settings.staging_cache_bytes
    cache = ContentCache(settings.agent_state_dir / "staging-cache", budget) if budget else None

    def cached(fetch: Fetcher, version: Versioned) -> Fetcher:
        return cache.fetcher(fetch, version) if cache is not None else fetch

    fetchers = Fetchers(
        {
            "s3": cached(s3.fetch, s3.version),
            "gcs": cached(gcs.fetch, gcs.version),
            "azure": cached(azure.fetch, azure.version),
            "web": cached(web.fetch, web.version),
            "git": cached(git.fetch, git.version),
            "datastore": datastores.fetch,
        }
    )
    uploaders = Uploaders(
        {"s3": s3.put, "gcs": gcs.put, "azure": azure.put, "datastore": datastores.put}
    )
    if request is not None:
        quiet_http_logs()  # a presigned URL is a credential
        platform = Platform(settings.minion_id, request, guard, ca)
        local = LocalRelay(platform)
        fetchers = Fetchers({**fetchers.by_kind, "platform": platform.fetch, "local": local.fetch})
        uploaders = Uploaders({**uploaders.by_kind, "platform": platform.put, "local": local.put})
    if tally is not None:
        return tally.fetchers(fetchers), tally.uploaders(uploaders)
    return fetchers, uploaders
