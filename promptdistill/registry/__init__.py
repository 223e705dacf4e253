"""The versioned template registry: immutable versions, movable labels, provenance.

Services read it through the light client (``promptdistill.client.Templates``); the
pipeline writes it through ``Registry``. See ``store`` for the layout and
``collection`` for how concurrent writers stay safe.
"""

from promptdistill.registry.backend import StoreUnavailableError
from promptdistill.registry.hashing import content_hash
from promptdistill.registry.records import parse_ref
from promptdistill.registry.store import Registry

__all__ = ["Registry", "StoreUnavailableError", "content_hash", "parse_ref"]
