"""Seeing a run: per-token heatmaps (`oarctl show --row`), the HTML run report, run comparisons.

Pure rendering lives in `heatmap`; reading artifacts and decoding tokens in `tokens`; matplotlib
only inside `plots` functions, so importing this package stays cheap.
"""
