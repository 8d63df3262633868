"""Kernel design spaces, CUDA templates and the nvcc artifact cache (CPU only: nothing
here touches a GPU)."""

from cudal2.generator.families import FAMILIES, family_of
from cudal2.generator.space import design_space, launch_recipe, legality

__all__ = ["FAMILIES", "design_space", "family_of", "launch_recipe", "legality"]
