"""Chapter 4's diagrams: where the norm sits (post-norm and pre-norm), and the decoder layer.

Each diagram is read off the layer itself. :func:`layer_steps` traces the layer's ``forward``
with ``torch.fx``, keeping every submodule whole, so the boxes are the submodules in the order
``forward`` calls them, each ``+`` is an addition in ``forward``, and every arrow is a tensor
passed from one step to the next. A residual path is an addition's input that skips the
sub-layer in between. Dropout and the ``[0]`` that picks attention's output from its
``(output, weights)`` pair are identities in the picture (dropout is one in evaluation mode).

Every box, ``+`` and arrow carries a ``gid`` naming what it stands for (``"norm1"``,
``"add1"``, ``"residual:x->add1"``, ``"flow:norm1->self_attn"``), which is also how the tests
read the drawn order back and compare it with a forward pass.
"""

from __future__ import annotations

import inspect
import operator
from dataclasses import dataclass

import matplotlib.pyplot as plt
import torch.fx
from matplotlib.figure import Figure
from matplotlib.patches import Circle, FancyArrowPatch, FancyBboxPatch
from matplotlib.path import Path
from torch import nn

from coursekit import viz
from coursekit.layers import DecoderLayer, EncoderLayer, FeedForward, LayerNorm, RMSNorm
from coursekit.multihead import MultiHeadAttention

__all__ = ["Step", "layer_steps", "norm_placement", "decoder_layer"]

#: the tensors a layer's forward takes as data; every other argument is fixed at its default
DATA_INPUTS = ("x", "memory")

# sizes in inches (the axes are drawn in inches, one data unit per inch)
_BOX_H, _ADD_R, _LABEL_H, _GAP = 0.34, 0.14, 0.24, 0.24
_FILL = {"norm": "#E69F00", "attention": "#56B4E9", "feed-forward": "#009E73", "other": "#CC79A7"}


@dataclass(frozen=True)
class Step:
    """One step of a layer's forward pass as a diagram draws it.

    Attributes:
        name: the submodule's attribute name (``"norm1"``, ``"self_attn"``), ``"add1"``,
            ``"add2"``, ... for the additions in the order they happen, or an input's name.
        kind: ``"input"``, ``"norm"``, ``"sublayer"`` or ``"add"``.
        label: the text drawn in the box.
        inputs: the names of the steps whose outputs it reads, in the order ``forward`` passes
            them (an addition: its two operands; cross-attention: its queries, then ``memory``).
    """

    name: str
    kind: str
    label: str
    inputs: tuple[str, ...] = ()


class _WholeModules(torch.fx.Tracer):
    """Trace only the layer's own forward: every submodule call is one node."""

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        return True


def _label(module: nn.Module, kwargs: dict) -> tuple[str, str]:
    if isinstance(module, (LayerNorm, nn.LayerNorm)):
        return "norm", "LayerNorm"
    if isinstance(module, RMSNorm):
        return "norm", "RMSNorm"
    if isinstance(module, MultiHeadAttention):
        if kwargs.get("kv") is not None:
            return "sublayer", "cross-attention"
        return "sublayer", "masked self-attention" if kwargs.get("is_causal") else "self-attention"
    if isinstance(module, FeedForward):
        return "sublayer", "feed-forward"
    return "sublayer", type(module).__name__


def layer_steps(layer: nn.Module) -> list[Step]:
    """The steps of ``layer.forward`` in the order it runs them, traced with ``torch.fx``.

    The data inputs (``x``, and ``memory`` for a decoder layer) are traced as tensors; every
    other argument of ``forward`` keeps its default, so a :class:`DecoderLayer` is traced with
    its default causal self-attention.

    Args:
        layer: an :class:`~coursekit.layers.EncoderLayer` or
            :class:`~coursekit.layers.DecoderLayer` (or any module whose forward calls its
            submodules and adds tensors).

    Returns:
        The inputs first, then one :class:`Step` per norm, sub-layer and addition. For a
        post-norm ``EncoderLayer``: ``x, self_attn, add1, norm1, ff, add2, norm2``.

    Raises:
        ValueError: if ``forward`` does something to the tensors other than calling a submodule,
            indexing its result or adding (the diagram would have no box for it).
    """
    defaults = {
        name: p.default
        for name, p in inspect.signature(layer.forward).parameters.items()
        if name not in DATA_INPUTS and p.default is not inspect.Parameter.empty
    }
    graph = _WholeModules().trace(layer, concrete_args=defaults)
    steps: list[Step] = []
    alias: dict[str, str] = {}  # fx node name -> the step whose value it is

    def tensor_inputs(node) -> tuple[str, ...]:
        found = [a for a in (*node.args, *node.kwargs.values()) if isinstance(a, torch.fx.Node)]
        return tuple(alias[a.name] for a in found if a.name in alias)

    n_adds = 0
    for node in graph.nodes:
        if node.op == "placeholder" and node.target in DATA_INPUTS:
            alias[node.name] = node.target
            steps.append(Step(node.target, "input", node.target))
        elif node.op == "call_module":
            module = layer.get_submodule(node.target)
            if isinstance(module, nn.Dropout):  # an identity in the picture
                alias[node.name] = tensor_inputs(node)[0]
                continue
            kind, label = _label(module, node.kwargs)
            alias[node.name] = node.target
            steps.append(Step(node.target, kind, label, tensor_inputs(node)))
        elif node.op == "call_function" and node.target is operator.getitem and tensor_inputs(node):
            alias[node.name] = tensor_inputs(node)[0]  # (output, weights)[0]
        elif node.op == "call_function" and node.target is operator.add:
            n_adds += 1
            alias[node.name] = f"add{n_adds}"
            steps.append(Step(f"add{n_adds}", "add", "+", tensor_inputs(node)))
        elif node.op in ("call_function", "call_method") and tensor_inputs(node):
            raise ValueError(f"cannot draw {node.format_node()}: only submodules, [0] and + have boxes")
    return steps


# --------------------------------------------------------------------------- drawing


def _height(step: Step) -> float:
    return {"input": _LABEL_H, "add": 2 * _ADD_R}.get(step.kind, _BOX_H)


def _column_height(steps: list[Step]) -> float:
    chain = [s for s in steps if s.name != "memory"]
    return sum(map(_height, chain)) + len(chain) * _GAP + _LABEL_H + 0.45  # + the output and a title


def _colour(step: Step) -> str:
    if step.kind == "norm":
        return _FILL["norm"]
    if "attention" in step.label:
        return _FILL["attention"]
    return _FILL.get(step.label, _FILL["other"])


def _arrow(ax, start, end, gid, path=None):
    arrow = FancyArrowPatch(
        start,
        end,
        path=path,
        arrowstyle="-|>",
        mutation_scale=12,
        lw=1.2,
        color="black",
        shrinkA=0,
        shrinkB=0,
    )
    arrow.set_gid(gid)
    ax.add_patch(arrow)


def _draw_column(ax, steps: list[Step], cx: float, top: float, box_w: float) -> None:
    """Draw ``steps`` top to bottom around the vertical line ``x = cx``, starting at ``top``."""
    chain = [s for s in steps if s.name != "memory"]
    if chain[0].kind != "input":
        raise ValueError(f"the first step must be an input, got {chain[0]}")
    span: dict[str, tuple[float, float]] = {}  # name -> (top, bottom)
    y = top
    for i, step in enumerate(chain):
        h = _height(step)
        span[step.name] = (y, y - h)
        centre = y - h / 2
        if step.kind == "input":
            ax.text(cx, centre, f"${step.label}$", ha="center", va="center")
        elif step.kind == "add":
            circle = Circle((cx, centre), _ADD_R, facecolor="white", edgecolor="black", lw=1.2)
            circle.set_gid(step.name)
            ax.add_patch(circle)
            ax.text(cx, centre, "+", ha="center", va="center", fontsize=14)
        else:
            colour = _colour(step)
            box = FancyBboxPatch(
                (cx - box_w / 2, y - h),
                box_w,
                h,
                boxstyle="round,pad=0,rounding_size=0.06",
                facecolor=colour + "55",
                edgecolor="black",
                lw=1.0,
            )
            box.set_gid(step.name)
            ax.add_patch(box)
            ax.text(cx, centre, step.label, ha="center", va="center")
        if i:
            previous = chain[i - 1]
            if previous.name not in step.inputs:
                raise ValueError(f"{step.name} does not read {previous.name}; a column cannot draw that")
            _arrow(ax, (cx, span[previous.name][1]), (cx, y), f"flow:{previous.name}->{step.name}")
            if step.kind == "add":  # the other operand arrives along the residual path
                (source,) = [n for n in step.inputs if n != previous.name] or [previous.name]
                branch_y = span[source][1] - 0.3 * _GAP
                left = cx - box_w / 2 - 0.25
                path = Path(
                    [(cx, branch_y), (left, branch_y), (left, centre), (cx - _ADD_R, centre)],
                    [Path.MOVETO, Path.LINETO, Path.LINETO, Path.LINETO],
                )
                _arrow(ax, None, None, f"residual:{source}->{step.name}", path=path)
                ax.plot([cx], [branch_y], "o", color="black", markersize=4)
            for extra in step.inputs:
                if extra == "memory":
                    x0 = cx + box_w / 2 + 0.3
                    ax.text(x0 + 0.05, centre, "encoder\noutput", ha="left", va="center")
                    _arrow(ax, (x0, centre), (cx + box_w / 2, centre), f"flow:memory->{step.name}")
        y -= h + _GAP
    last = chain[-1]
    _arrow(ax, (cx, span[last.name][1]), (cx, y + _GAP - 0.3), f"flow:{last.name}->output")
    ax.text(cx, y + _GAP - 0.3 - 0.05, "output", ha="center", va="top")


def _placement(layer: nn.Module) -> str:
    return "pre-norm" if layer.norm_first else "post-norm"


def _box_width(steps: list[Step]) -> float:
    return 0.3 + 0.085 * max(len(s.label) for s in steps if s.kind in ("norm", "sublayer"))


def norm_placement(post: EncoderLayer | None = None, pre: EncoderLayer | None = None) -> Figure:
    """Post-norm and pre-norm encoder layers side by side, drawn from their traced forward.

    Args:
        post: the layer drawn on the left (default: a small ``EncoderLayer(norm_first=False)``).
        pre: the layer drawn on the right (default: a small ``EncoderLayer(norm_first=True)``).
            Each column's title is read from its layer's ``norm_first``.

    Returns:
        A 5.5-inch-wide figure with one axes per layer.
    """
    layers = [post or EncoderLayer(8, 2, norm_first=False), pre or EncoderLayer(8, 2, norm_first=True)]
    columns = [layer_steps(layer) for layer in layers]
    height = max(map(_column_height, columns)) + 0.3
    width = 5.5
    with plt.style.context(viz.BOOK_STYLE):
        fig = plt.figure(figsize=(width, height), layout="none")
        for i, (layer, steps) in enumerate(zip(layers, columns)):
            ax = fig.add_axes((i / 2, 0, 1 / 2, 1))
            ax.set(xlim=(0, width / 2), ylim=(0, height))
            ax.set_axis_off()
            cx = width / 4 + 0.15
            ax.text(cx, height - 0.05, _placement(layer), ha="center", va="top")
            ax.text(
                cx, height - 0.3, f"norm_first={layer.norm_first}", ha="center", va="top", family="monospace"
            )
            _draw_column(ax, steps, cx=cx, top=height - 0.6, box_w=_box_width(steps))
    return fig


def decoder_layer(layer: DecoderLayer | None = None) -> Figure:
    """A decoder layer drawn from its traced forward: masked self-attention, cross-attention
    over the encoder's output, feed-forward, each with its residual path and norm.

    Args:
        layer: the layer to draw (default: a small post-norm ``DecoderLayer``, the original
            placement).

    Returns:
        A figure at most 5.5 inches wide.
    """
    layer = layer or DecoderLayer(8, 2, norm_first=False)
    steps = layer_steps(layer)
    box_w = _box_width(steps)
    height = _column_height(steps) + 0.1
    width = min(5.5, box_w + 2.4)
    with plt.style.context(viz.BOOK_STYLE):
        fig = plt.figure(figsize=(width, height), layout="none")
        ax = fig.add_axes((0, 0, 1, 1))
        ax.set(xlim=(0, width), ylim=(0, height))
        ax.set_axis_off()
        cx = 0.5 + box_w / 2
        ax.text(cx, height - 0.05, f"decoder layer, {_placement(layer)}", ha="center", va="top")
        _draw_column(ax, steps, cx=cx, top=height - 0.4, box_w=box_w)
    return fig
