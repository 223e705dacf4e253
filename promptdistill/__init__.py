"""promptdistill."""

__all__ = ["Templates"]


def __getattr__(name: str):
    # Lazy, so that ``import promptdistill`` stays as light as the registry client.
    if name == "Templates":
        from promptdistill.client import Templates

        return Templates
    raise AttributeError(f"module 'promptdistill' has no attribute {name!r}")
