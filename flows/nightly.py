"""This repository's Prefect entrypoint for the ``nightly`` flow (see ``prefect.yaml``).

The flow itself ships with the package: :mod:`promptdistill.flows.nightly`.
"""

from promptdistill.flows.nightly import nightly

__all__ = ["nightly"]

if __name__ == "__main__":
    nightly()
