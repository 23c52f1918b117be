"""Federation conditions (issue 47): availability, dropout, system heterogeneity, deadlines, over-selection, and
upload compression, drawn from the run's seeded streams so that a resumed run is byte-identical.

``settings``: the keys' rules (no torch); ``rounds``: what a round's conditions decide (who answers, how many
local steps each finishes, the simulated clock); :mod:`pfl_cli.fl.compression`: the upload compressors.
"""
