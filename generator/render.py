"""Render a design to CUDA source with logic-free jinja2 templates.

A family's template_context(d) feeds its entry template; the choices a design makes
(which partial, which spelling) are made in Python (tags.py), never in a template.
"""

from __future__ import annotations

from functools import cache

import jinja2

from cudal2 import __version__
from cudal2.generator import tags
from cudal2.generator.families import family_of
from cudal2.generator.families.base import pdl_trigger
from cudal2.generator.space import design_name, legality
from cudal2.records import KernelDesign


class IllegalDesignError(ValueError):
    """Raised when asked to render a design that fails its family's legality check."""


@cache
def _env() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.PackageLoader("cudal2.generator", "templates"),
        undefined=jinja2.StrictUndefined,  # a missing knob is an error, never an empty string
        keep_trailing_newline=True,
        # A tag's own line break goes with it: an <% include %> on its own line
        # stands for exactly the partial's lines, as #include would.
        trim_blocks=True,
        autoescape=False,
        # Inline PTX is full of "{%0, %1}": move jinja's block and comment markers
        # out of its way. Templates hold only {{ substitutions }}, <% include %> of
        # partials and <# comments #>; every choice is made in Python (tags.py).
        block_start_string="<%",
        block_end_string="%>",
        comment_start_string="<#",
        comment_end_string="#>",
    )


def symbol(design: KernelDesign) -> str:
    """The kernel's extern "C" symbol: its procedural name."""
    return design_name(design)


def _label(design: KernelDesign) -> str:
    """A name for messages, also for designs whose knobs are not their family's."""
    try:
        return design_name(design)
    except (ValueError, AttributeError):
        return f"{design.family} {design.knobs.as_json()}"


def render(design: KernelDesign) -> str:
    """CUDA source for one design (raises IllegalDesignError listing every reason)."""
    reasons = legality(design)
    if reasons:
        raise IllegalDesignError(f"{_label(design)}: " + "; ".join(reasons))
    fam = family_of(design.family)
    ctx = fam.template_context(design)
    # The PDL partials (all NONE for a plain design); a family with more than one
    # kernel (sm90tma's persistent one) names its kernel's prefetch itself.
    ctx.setdefault("pdl", tags.pdl(design.family, design.layout, pdl_trigger(design)))
    ctx.update(
        name=symbol(design),
        symbol=symbol(design),
        design_key=design.key,
        arch=design.arch,
        tool_version=__version__,
    )
    return _env().get_template(fam.TEMPLATE).render(**ctx)
