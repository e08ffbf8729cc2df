"""json: every refusal's fix works when followed; NaN and infinity are not offered
`json_numpy: convert`, which keeps them (issue 17 item 13)."""

from __future__ import annotations

import numpy as np
import pytest

from betonbuild.config.load import load_config
from betonbuild.errors import SampleError
from betonbuild.write.contract import check_value

FIELDS = {"meta": {"type": "json"}, "meta_conv": {"type": "json", "json_numpy": "convert"}}
SPEC = load_config({"datasets": {"d": {"source": {"kind": "python", "factory": "m:f"}, "fields": FIELDS}}})
FIELD = {f.name: f for f in SPEC.datasets["d"].fields}


def refused(field: str, value) -> SampleError:
    with pytest.raises(SampleError) as info:
        check_value("d", FIELD[field], value, 3)
    return info.value


NON_FINITE = [
    {"score": float("nan")},
    {"score": float("inf")},
    [1.0, float("-inf")],
    {"score": np.float64("nan")},
    {"box": np.array([1.0, np.nan], dtype=np.float32)},
]


@pytest.mark.parametrize("value", NON_FINITE)
@pytest.mark.parametrize("field", ["meta", "meta_conv"])
def test_nan_and_infinity_get_a_fix_that_works_not_json_numpy_convert(field, value):
    error = refused(field, value)
    assert "JSON cannot represent" in error.why
    assert "json_numpy" not in error.fix
    assert "replace NaN and infinity with None" in error.fix


def test_following_the_nan_fix_is_accepted():
    assert check_value("d", FIELD["meta"], {"score": None, "xs": [1.0, None]}, 3) == {"score": None, "xs": [1.0, None]}


def test_the_numpy_fix_still_offers_json_numpy_convert_and_following_it_works():
    assert "`json_numpy: convert`" in refused("meta", {"label": np.int64(3)}).fix
    assert check_value("d", FIELD["meta_conv"], {"label": np.int64(3)}, 3) == {"label": 3}


def test_a_non_str_key_is_told_to_use_str_keys_and_following_it_works():
    error = refused("meta_conv", {1: "a"})
    assert "json_numpy" not in error.fix and "str keys" in error.fix
    assert check_value("d", FIELD["meta_conv"], {str(1): "a"}, 3) == {"1": "a"}
