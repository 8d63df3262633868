"""Kernel design spaces, CUDA templates and the nvcc artifact cache (CPU only: nothing
here touches a GPU)."""

from cudal2.generator.families import FAMILIES, family_of
from cudal2.generator.families.base import Features, Knob
from cudal2.generator.space import design_name, design_space, features, launch_recipe, legality

__all__ = [
    "FAMILIES",
    "Features",
    "Knob",
    "design_name",
    "design_space",
    "family_of",
    "features",
    "launch_recipe",
    "legality",
]
