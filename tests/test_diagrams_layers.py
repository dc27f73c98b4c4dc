"""Chapter 4's diagrams draw what the layers compute.

The drawn order is read back from the figure (every box, ``+`` and arrow carries a ``gid``) and
compared with an independent record of the forward pass: forward hooks on the layer's
submodules give the order they run in, and running the drawn boxes as a program, each arrow
a tensor and each ``+`` an addition of the two tensors drawn into it, must give the layer's
output.
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")  # headless; must precede any pyplot import

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from matplotlib.patches import Circle, FancyArrowPatch, FancyBboxPatch  # noqa: E402
from matplotlib.text import Text  # noqa: E402
from torch import nn  # noqa: E402

from coursekit.diagrams import layers as diagrams  # noqa: E402
from coursekit.layers import DecoderLayer, EncoderLayer  # noqa: E402
from coursekit.multihead import MultiHeadAttention  # noqa: E402

C, H = 8, 2
#: float64 on tiny shapes: the drawn program and the layer do the same operations in the same order
TOL = dict(rtol=1e-12, atol=1e-12)

#: which figure and which of its axes draws each layer
CASES = {
    "encoder, post-norm": (lambda: EncoderLayer(C, H, norm_first=False), "norm_placement", 0),
    "encoder, pre-norm": (lambda: EncoderLayer(C, H, norm_first=True), "norm_placement", 1),
    "decoder, post-norm": (lambda: DecoderLayer(C, H, norm_first=False), "decoder_layer", 0),
    "decoder, pre-norm": (lambda: DecoderLayer(C, H, norm_first=True), "decoder_layer", 0),
}


def draw(kind: str, layer: nn.Module):
    if kind == "norm_placement":
        other = EncoderLayer(C, H, norm_first=not layer.norm_first)
        return diagrams.norm_placement(*((other, layer) if layer.norm_first else (layer, other)))
    return diagrams.decoder_layer(layer)


def drawn(ax) -> tuple[list[str], dict[str, list[tuple[str, str]]]]:
    """The boxes and ``+`` of one axes from top to bottom, and for each the arrows drawn into it."""

    def centre_y(p):
        return p.center[1] if isinstance(p, Circle) else p.get_y() + p.get_height() / 2

    shapes = [p for p in ax.patches if isinstance(p, (Circle, FancyBboxPatch)) and p.get_gid()]
    order = [p.get_gid() for p in sorted(shapes, key=centre_y, reverse=True)]
    into: dict[str, list[tuple[str, str]]] = {}
    for p in ax.patches:
        if isinstance(p, FancyArrowPatch) and p.get_gid():
            kind, _, pair = p.get_gid().partition(":")
            source, target = pair.split("->")
            into.setdefault(target, []).append((kind, source))
    return order, into


def inputs(layer: nn.Module, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 5, C, generator=g, dtype=torch.float64)  # (B, T, C)
    memory = torch.randn(2, 7, C, generator=g, dtype=torch.float64)  # (B, S, C)
    return (x, memory) if isinstance(layer, DecoderLayer) else (x,)


def forward_order(layer: nn.Module, *args) -> list[str]:
    """The submodules (dropout aside) in the order a forward pass runs them, by forward hooks."""
    calls: list[str] = []
    hooks = [
        module.register_forward_hook(lambda mod, inp, out, name=name: calls.append(name))
        for name, module in layer.named_children()
        if not isinstance(module, nn.Dropout)
    ]
    try:
        layer(*args)
    finally:
        for h in hooks:
            h.remove()
    return calls


def run_drawn(layer: nn.Module, order, into, x, memory=None):
    """Execute the drawing: each box applies its submodule to the tensor its arrow brings."""
    causal = isinstance(layer, DecoderLayer)  # each layer's default in forward
    values, previous = {"x": x, "memory": memory}, "x"
    for name in order:
        flows = [s for kind, s in into.get(name, []) if kind == "flow" and s != "memory"]
        assert flows == [previous], f"{name}: the arrow into it comes from {flows}, not {previous}"
        h = values[previous]
        if name.startswith("add"):
            (residual,) = [s for kind, s in into[name] if kind == "residual"]
            values[name] = h + values[residual]
        else:
            module = layer.get_submodule(name)
            if ("flow", "memory") in into[name]:
                values[name] = module(h, kv=memory)[0]
            elif isinstance(module, MultiHeadAttention):
                values[name] = module(h, is_causal=causal)[0]
            else:
                values[name] = module(h)
        previous = name
    assert into["output"] == [("flow", previous)]
    return values[previous]


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


@pytest.mark.parametrize("case", CASES)
def test_drawn_order_is_the_forward_order(case):
    make, kind, index = CASES[case]
    torch.manual_seed(0)
    layer = make().double().eval()
    fig = draw(kind, layer)
    order, _ = drawn(fig.axes[index])
    assert [name for name in order if not name.startswith("add")] == forward_order(layer, *inputs(layer))


@pytest.mark.parametrize("case", CASES)
def test_running_the_drawing_gives_the_layer_output(case):
    make, kind, index = CASES[case]
    torch.manual_seed(0)
    layer = make().double().eval()
    fig = draw(kind, layer)
    order, into = drawn(fig.axes[index])
    args = inputs(layer)
    with torch.no_grad():
        torch.testing.assert_close(run_drawn(layer, order, into, *args), layer(*args), **TOL)


def test_a_wrong_residual_path_would_be_caught():
    """Post-norm's second residual starts after norm1; drawn from the add instead, the run differs."""
    torch.manual_seed(0)
    layer = EncoderLayer(C, H, norm_first=False).double().eval()
    fig = diagrams.norm_placement(post=layer)
    order, into = drawn(fig.axes[0])
    assert ("residual", "norm1") in into["add2"]
    into["add2"] = [("residual", "add1") if edge == ("residual", "norm1") else edge for edge in into["add2"]]
    (x,) = inputs(layer)
    with torch.no_grad():
        assert not torch.allclose(run_drawn(layer, order, into, x), layer(x))


def test_the_two_placements_as_the_papers_draw_them():
    """Vaswani et al. (2017): sub-layer, add, norm; Xiong et al. (2020): norm, sub-layer, add."""
    fig = diagrams.norm_placement()
    labels = []
    for ax in fig.axes:
        order, into = drawn(ax)
        labels.append(order)
        assert [t.get_text() for t in ax.texts if "norm_first" in t.get_text()] in (
            ["norm_first=False"],
            ["norm_first=True"],
        )
    post, pre = labels
    assert post == ["self_attn", "add1", "norm1", "ff", "add2", "norm2"]
    assert pre == ["norm1", "self_attn", "add1", "norm2", "ff", "add2"]


def test_decoder_diagram_names_its_sub_layers():
    fig = diagrams.decoder_layer()
    words = [t.get_text() for t in fig.axes[0].texts]
    assert [w for w in words if "attention" in w or w == "feed-forward"] == [
        "masked self-attention",
        "cross-attention",
        "feed-forward",
    ]
    assert "encoder\noutput" in words


@pytest.mark.parametrize("make", [diagrams.norm_placement, diagrams.decoder_layer])
def test_book_style(make):
    fig = make()
    width, _ = fig.get_size_inches()
    assert width <= 5.5
    texts = [t for ax in fig.axes for t in ax.findobj(Text) if t.get_text().strip()]
    assert texts and min(t.get_fontsize() for t in texts) >= 11


def test_an_operation_without_a_box_is_refused():
    class Scaled(EncoderLayer):
        def forward(self, x):
            return 2 * super().forward(x)

    with pytest.raises(ValueError, match="cannot draw"):
        diagrams.layer_steps(Scaled(C, H))
