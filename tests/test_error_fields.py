"""The errors that cross processes keep every field, however they were built (pure)."""

import pickle

import pytest

from hpcmesh.runtime.errors import ActorError, MeshStoppedError, SupervisionError
from hpcmesh.shapes import Extent, Point

POINT = Point(1, Extent({"gpus": 2}))


@pytest.mark.parametrize("err, fields", [
    (ActorError("KeyError", "'k'", point=POINT, endpoint="get"),
     ("KeyError", "'k'", "", POINT, "", "get", "", "")),
    (SupervisionError("gone", "workers", POINT, pid=42, reason="host lost"),
     ("gone", "workers", POINT, "", 42, "", "host lost")),
    (MeshStoppedError("stopped", mesh="echo"), ("stopped", "echo", None, "", None, "", "")),
])
def test_args_are_every_field_in_order_and_survive_pickling(err, fields):
    # args (what pickling calls the class with, what repr shows) hold the keywords too
    assert err.args == fields
    assert repr(err) == f"{type(err).__name__}{fields!r}"
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is type(err) and back.args == fields
    assert vars(back) == vars(err) and str(back) == str(err)
    assert err != type(err)(*fields)        # compared as exceptions are: by identity
