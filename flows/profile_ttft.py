"""This repository's Prefect entrypoint for the ``profile_ttft`` flow (see ``prefect.yaml``).

The flow itself ships with the package: :mod:`promptdistill.flows.profile_ttft`.
"""

from promptdistill.flows.profile_ttft import profile_ttft

__all__ = ["profile_ttft"]

if __name__ == "__main__":
    profile_ttft()
