"""The versioned template registry: immutable versions, movable labels, provenance.

Services read it through the light client (``promptdistill.client.Templates``); the
pipeline writes it through ``Registry``. See ``store`` for the layout and
``collection`` for how concurrent writers stay safe.
"""

from promptdistill.registry.backend import StoreUnavailableError
from promptdistill.registry.hashing import content_hash
from promptdistill.registry.records import ArtifactRecord, LabelEvent, VersionRecord, parse_ref
from promptdistill.registry.store import Registry, code_provenance, default_actor

__all__ = [
    "ArtifactRecord",
    "LabelEvent",
    "Registry",
    "StoreUnavailableError",
    "VersionRecord",
    "code_provenance",
    "content_hash",
    "default_actor",
    "parse_ref",
]
