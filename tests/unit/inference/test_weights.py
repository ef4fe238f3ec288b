"""``resolve_under``: a weights path the OS cannot look up is a 400 ``WeightsError`` that says why, never an
exception out of the route (the API fuzz suite found each of these as a 500 of ``/collective_rpc``)."""

from __future__ import annotations

import pytest

from services.inference.weights import WeightsError, resolve_under


@pytest.mark.parametrize(
    ("path", "says"),
    [
        ("\x00", "NUL byte"),
        ("{root}/a\x00b", "NUL byte"),
        ("{root}/" + "x" * 300, "not a usable path: File name too long"),
        ("~no-such-user-coda/x", "not a usable path"),
    ],
)
def test_unusable_paths_are_400s_that_say_why(tmp_path, path, says):
    with pytest.raises(WeightsError) as caught:
        resolve_under(tmp_path, path.format(root=tmp_path), "weights path")
    assert caught.value.status_code == 400 and says in str(caught.value)


def test_outside_missing_and_present_paths(tmp_path):
    (tmp_path / "v1").mkdir()
    assert resolve_under(tmp_path, str(tmp_path / "v1"), "weights path") == (tmp_path / "v1").resolve()
    with pytest.raises(WeightsError, match="does not exist") as missing:
        resolve_under(tmp_path, str(tmp_path / "v2"), "weights path")
    assert missing.value.status_code == 404
    with pytest.raises(WeightsError, match="outside the weights root"):
        resolve_under(tmp_path, str(tmp_path / ".." / "x"), "weights path")
