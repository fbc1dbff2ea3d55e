"""Which plans exist for a workload: named spaces, their narrowing, enumeration with reasons, Tune mapping."""

from search_spaces.enumerate import Enumeration, candidate_count, enumerate_plans, explain, rejected, sample_plans
from search_spaces.space import SpaceConfig, load_space, narrow, preset_names, resolve_space
from search_spaces.tune_space import GROUP_AXES, TuneSpace

__all__ = [
    "GROUP_AXES", "Enumeration", "SpaceConfig", "TuneSpace", "candidate_count", "enumerate_plans", "explain", "load_space", "narrow",
    "preset_names", "rejected", "resolve_space", "sample_plans",
]
