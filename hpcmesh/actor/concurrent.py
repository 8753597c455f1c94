"""``monarch.actor.concurrent`` under hpcmesh's name: ``from hpcmesh.actor.concurrent import
concurrent_endpoint``."""

from .endpoint import concurrent_endpoint

__all__ = ["concurrent_endpoint"]
