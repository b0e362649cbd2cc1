"""The GPU catalogue (catalog.json) against PRODUCT.md: every model's memory, TFLOPS and class
as section 9's table says, and its usage fee as R-BILL-1 says for its class. The tables are
copied here as data, so a change to the catalogue that the product rules do not make fails."""

from __future__ import annotations

from decimal import Decimal

import pytest
from gpufleet_contracts.catalog import catalog

pytestmark = pytest.mark.unit

# PRODUCT.md section 9: GPU -> memory GB, FP32 TFLOPS, FP16 TFLOPS, class ("—": None).
SECTION_9 = {
    "GTX 1060": (6, "4.5", "0.9", "development"),
    "RTX 2060 Super": (8, "7.1", "15", "development"),
    "RTX 2070 Super": (8, "9", "18.5", "development"),
    "RTX 2080 Ti": (11, "13.5", "25", "development"),
    "RTX 3090": (24, "35.5", "39", "development"),
    "RTX A4000": (16, "9.7", "19", "professional"),
    "RTX A6000": (48, "36", "40", "professional"),
    "T4": (16, "7.5", "15.5", "datacenter"),
    "P100": (16, "8", "16", "datacenter"),
    "V100": (16, "15", "25.5", "datacenter"),
    "A100 40GB": (40, "39", "62.5", "datacenter"),
    "A100 80GB": (80, "39", "62.5", "datacenter"),
    "H100 80GB": (80, None, None, "datacenter"),
    "H200": (141, None, None, "datacenter"),
}
# R-BILL-1: usage fee per GPU-hour by class (development GeForce; professional Quadro / RTX
# A-series; datacenter Tesla-class T4, P100, V100, A100, H100, H200).
R_BILL_1 = {"development": "0.05", "professional": "0.10", "datacenter": "0.25"}
R_BILL_1_DATACENTER = ("T4", "P100", "V100", "A100 40GB", "A100 80GB", "H100 80GB", "H200")


def test_the_catalogue_has_section_9s_models_and_no_other() -> None:
    assert catalog().model_names() == list(SECTION_9)


@pytest.mark.parametrize("model", list(SECTION_9))
def test_each_models_figures_and_class_are_section_9s(model: str) -> None:
    memory, fp32, fp16, gpu_class = SECTION_9[model]
    gpu = catalog().gpus[model]
    assert (gpu.memory_gb, gpu.gpu_class) == (memory, gpu_class)
    assert gpu.fp32_tflops == (None if fp32 is None else Decimal(fp32))
    assert gpu.fp16_tflops == (None if fp16 is None else Decimal(fp16))


@pytest.mark.parametrize("model", list(SECTION_9))
def test_each_models_usage_fee_is_r_bill_1s_for_its_class(model: str) -> None:
    fee = catalog().usage_fee_per_gpu_hour(model)
    assert fee == Decimal(R_BILL_1[SECTION_9[model][3]])
    assert (fee == Decimal("0.25")) is (model in R_BILL_1_DATACENTER)


def test_the_class_fees_are_r_bill_1s() -> None:
    assert catalog().usage_fee == {k: Decimal(v) for k, v in R_BILL_1.items()}
