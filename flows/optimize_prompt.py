"""This repository's Prefect entrypoint for the ``optimize_prompt`` flow (see ``prefect.yaml``).

The flow itself ships with the package: :mod:`promptdistill.flows.optimize_prompt`.
"""

from promptdistill.flows.optimize_prompt import optimize_prompt

__all__ = ["optimize_prompt"]

if __name__ == "__main__":
    import sys

    optimize_prompt(sys.argv[1])
