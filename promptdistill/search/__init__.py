"""The one search kernel the distiller and the optimizer share.

* :mod:`~promptdistill.search.splits`: train / screen / certify / test records;
* :mod:`~promptdistill.search.budget`: LM calls and minutes;
* :mod:`~promptdistill.search.sequential`: anytime-valid bounds and record planning;
* :mod:`~promptdistill.search.racing`: candidates, screening, the race, selection.
"""
