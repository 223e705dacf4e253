"""This repository's Prefect entrypoints: the flows live in :mod:`promptdistill.flows`."""
