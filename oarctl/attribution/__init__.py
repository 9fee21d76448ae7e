"""Token attribution methods: one registry, one signature (`oarctl.attribution.base`).

Importing this package registers every method, in the order `ATTRIBUTION_METHODS.names()` lists
them: the controls, then OAR-P/OAR-G/entropy, the cheap OAR-P variants, the propagated ones, the
chains labels, mc_value, and the methods users pick instead (TRL's entropy_mask, KTAE). Modules that need the full registry (config, the attribute stage)
import it from here; a method module imports it from `base`.
"""
from __future__ import annotations

from oarctl.attribution.base import ATTRIBUTION_METHODS  # noqa: F401  (the registry, every method in it)
from oarctl.attribution import controls  # noqa: F401  (registers uniform, random)
from oarctl.attribution import oar  # noqa: F401  (registers oar_p, oar_g, entropy)
from oarctl.attribution import oar_p_cheap  # noqa: F401  (registers oar_p_span, oar_p_screened)
from oarctl.attribution import flow  # noqa: F401  (registers oar_flow, oar_flow_span)
from oarctl.attribution import flow_local  # noqa: F401  (registers oar_flow_local)
from oarctl.attribution import ground_truth  # noqa: F401  (registers truth, truth_shuffled, truth_last)
from oarctl.attribution import mc_value  # noqa: F401  (registers mc_value)
from oarctl.attribution import entropy_mask  # noqa: F401  (registers entropy_mask)
from oarctl.attribution import ktae  # noqa: F401  (registers ktae)
from oarctl.attribution.oar import oar_g, oar_g_batch, oar_p, oar_p_batch  # noqa: F401  (the public API)
from oarctl.attribution.flow import oar_flow  # noqa: F401  (the public API)
from oarctl.attribution.flow_local import oar_flow_local  # noqa: F401  (the public API)
