"""Our kernels as PyTorch operators, all in one namespace: torch.ops.llmk.<name>.

Each public function (rmsnorm, flash_attention, matmul, ...) checks its arguments in Python and then
calls its operator. The operator is what torch.compile puts into a graph (as an opaque call, shaped
by its fake implementation, never traced into), what a CUDA graph captures, and where autograd
meets the kernel.

    rmsnorm_op = define_op("rmsnorm(Tensor x, Tensor weight, float eps) -> Tensor", impl, fake)

registers `impl` (which launches the kernel on checked arguments) for CPU tensors (the interpreter)
and CUDA tensors, `fake` (shapes, dtypes and strides of the outputs, no data) for torch.compile's
tracing, and an autograd kernel. An op that writes a caller's buffer is a second operator,
`<name>_out`, whose schema marks the buffer as mutated, `Tensor(a!) out`, and returns nothing;
define_ops makes the pair from one allocation and one kernel call.

Why torch.library.Library and not torch.library.custom_op (or triton_op): the same dispatcher
entry without custom_op's Python wrapping around every call, and the kernels' launchers stay plain
Python (triton_op would have torch.compile trace into them). benchmarks/host_bench.py measures the
host cost of each way (docs/results/host.md).

Backward: an operator defined with `backward` and `setup_context` gets them as its autograd
formula (torch.library.register_autograd, the same contract as an autograd.Function's
setup_context/backward), with one difference: setup_context's `inputs` are bound by name, a
namedtuple of the schema's arguments (`inputs.eps`, `inputs.window_left`), so a formula reads what
it needs by name and an argument added to the schema changes no formula that does not use it.
The backward calls operators of its own (`<name>_backward`, defined with
define_op and no backward of their own), so torch.compile traces it through their fake
implementations and a compiled training step holds our kernels for both passes.

Forward-only: an operator without a backward gets an autograd kernel that raises when grad mode is
on and any tensor argument requires grad, instead of returning outputs that are cut from the graph
(a silently wrong gradient). So do the `_out` twins (they write a caller's buffer: there is nothing
to differentiate) and the backward operators (no double backward). Under torch.no_grad() or
torch.inference_mode() nothing changes.
"""

import inspect
from collections import namedtuple

import torch

from llmk.common.torch_private import (
    after_autograd_keyset,
    dispatch_mode_depth,
    function_apply,
    functorch_active,
    schema_arguments,
    unwrap_dead_wrappers,
)

NAMESPACE = "llmk"

_LIBRARY = []  # the torch.library.Library that owns our definitions, made on first use
OPS = {}  # name -> Op, every operator defined so far (tests look up which have a backward)


def _library():
    if not _LIBRARY:
        _LIBRARY.append(torch.library.Library(NAMESPACE, "DEF"))
    return _LIBRARY[0]


def _tensors(args):
    """The tensors among an op's arguments, looking one level into lists (AdamW's lists of tensors)."""
    for a in args:
        if isinstance(a, torch.Tensor):
            yield a
        elif isinstance(a, (list, tuple)):
            yield from (t for t in a if isinstance(t, torch.Tensor))


def needs_grad(*tensors):
    """Whether autograd would record a call on `tensors` (None entries allowed): grad mode is on and
    one of them requires grad."""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def forward_only_error(name, remedy=None):
    """The error of a forward-only op called under grad. remedy: how else to get gradients (an
    `_out` twin of a differentiable op: its functional form), said first."""
    return RuntimeError(
        f"{NAMESPACE}::{name} is forward-only (it has no backward), and an input requires grad: "
        + (f"{remedy}, or call it" if remedy else "call it")
        + " under torch.no_grad() or torch.inference_mode(), or pass detached tensors"
    )


def _forward_only_kernel(name, op, remedy=None):
    """Autograd kernel of an op without a backward: raise under grad, else run the op below autograd."""

    def autograd_kernel(keyset, *args):
        if needs_grad(*_tensors(args)):
            raise forward_only_error(name, remedy)
        return op.redispatch(keyset & after_autograd_keyset, *args)

    return autograd_kernel


# Tensor types a direct call may take: plain tensors and parameters, no subclass that dispatches in
# Python (FakeTensor, FunctionalTensor, ...), whose calls must go through the dispatcher
_PLAIN = (torch.Tensor, torch.nn.Parameter)


def _binder(name, overload):
    """A function with the operator's signature, `name(x, weight, eps, offset=0.0)`, that returns
    its arguments in the schema's order with the defaults filled in: Python binds a call's names
    to the schema's, and raises its own TypeError naming the operator and the argument for one
    it does not know, one given twice or one left out."""
    arguments = schema_arguments(overload)
    names = [a.name for a in arguments]
    defaults = {f"_default_{i}": a.default_value for i, a in enumerate(arguments) if a.has_default_value()}
    params = ", ".join(f"{n}=_default_{i}" if f"_default_{i}" in defaults else n for i, n in enumerate(names))
    namespace = dict(defaults)
    exec(f"def {name}({params}):\n    return ({', '.join(names)},)\n", namespace)
    return namespace[name]


class Op:
    """A registered operator and its implementation, called as `op(*args, **kwargs)` with the
    schema's arguments, by position or by the schema's names (`rmsnorm_op(x, weight, eps=eps,
    offset=offset)`; `bind` puts those in order).

    Under torch.compile, under a dispatch mode (FakeTensorMode, a TorchDispatchMode) or with a
    tensor subclass, the call goes through the dispatcher: `op.overload`, torch.ops.llmk.<name>.
    An eager call on plain tensors runs `op.impl` directly. That is the same code the dispatcher
    would reach, minus its cost: the dispatcher's two Python kernels (autograd, then CPU/CUDA)
    cost 8-35 us of host time a call on the H200's host under torch.no_grad() (3-17 us under
    inference_mode, which skips the autograd one), where the kernels of a decode step run for
    5-20 us; this check costs ~2 us (docs/results/host.md). A call that autograd must record (grad
    mode on, an input that requires grad) runs `op.function`, an autograd.Function of the same
    impl, setup_context and backward as the operator's autograd registration (one C++ autograd
    node, no dispatcher hops), when the op has a backward; it raises the forward-only error when
    it has none.
    """

    def __init__(self, name, impl, overload, function=None, remedy=None):
        self.name, self.impl, self.overload, self.function = name, impl, overload, function
        self.differentiable, self.remedy = function is not None, remedy
        # autograd.Function.apply below its Python layer, for calls that pass every argument of
        # the schema: that layer binds them to forward's signature (inspect.signature, 30-40 us
        # of host time a call on an H100's host) only to fill in defaults
        self._apply = None if function is None else function_apply(function)
        self._n_args = len(schema_arguments(overload))
        # bind(*args, **kwargs): the schema's arguments in order, every one, the defaults filled in
        # (~0.3 us of host time a call); TypeError for a name the schema lacks, an argument given
        # twice or one left out. Made here, not on the first call by name: torch.compile inlines
        # the function, but cannot trace the exec that makes it (~0.1 ms an op, once)
        self.bind = _binder(name, overload)

    def _recorded(self, *args):
        if not self.differentiable:
            raise forward_only_error(self.name, self.remedy)
        # the trailing defaults filled in: setup_context gets every argument, as from the dispatcher
        # (one left out that has no default: bind's TypeError)
        if len(args) < self._n_args:
            args = self.bind(*args)
        if functorch_active():  # vmap, grad, ...
            return self.function.apply(*args)
        return self._apply(*unwrap_dead_wrappers(args))

    def __call__(self, *args, **kwargs):
        if kwargs:  # by position from here on: under torch.compile too, where an `out=` keyword is Dynamo's
            args = self.bind(*args, **kwargs)
        if torch.compiler.is_compiling() or dispatch_mode_depth():
            return self.overload(*args)
        grad = torch.is_grad_enabled()
        for a in args:  # one pass, no generator: this runs on every eager call
            if type(a) in _PLAIN:
                if grad and a.requires_grad:
                    return self._recorded(*args)
            elif isinstance(a, torch.Tensor):  # a subclass: the dispatcher decides
                return self.overload(*args)
            elif type(a) is list and a and isinstance(a[0], torch.Tensor):
                if any(type(t) not in _PLAIN for t in a):
                    return self.overload(*args)
                if grad and any(t.requires_grad for t in a):
                    return self._recorded(*args)
        return self.impl(*args)


def _autograd_function(name, impl, formula_setup_context, formula_backward):
    """The op's eager autograd node (Op._recorded): forward is the op's impl, setup_context and
    backward are the formula register_autograd got, so eager calls and the dispatcher's autograd
    kernel compute the same gradients. One class per op: autograd.Function keeps its methods on
    the class, and ctx.needs_input_grad follows the schema's arguments."""

    def forward(*args):
        return impl(*args)

    # torch 2.14's apply (in C, even below the Python layer Op._recorded skips) binds forward's
    # signature to fill in its defaults: a forward that is impl itself would turn an impl's own
    # defaulted parameters beyond the schema into inputs that backward returns no gradient for.
    # This forward takes exactly what it is given (the schema's arguments), and its cached
    # signature spares apply the inspection every call (22 -> 12 us of host time on 2.14)
    forward.__signature__ = inspect.signature(forward)

    class OpFunction(torch.autograd.Function):
        setup_context = staticmethod(formula_setup_context)
        backward = staticmethod(formula_backward)

    OpFunction.forward = staticmethod(forward)

    OpFunction.__name__ = OpFunction.__qualname__ = f"{name}_function"
    return OpFunction


def _bound_by_name(name, overload, setup_context):
    """setup_context with its inputs as a namedtuple of the schema's argument names (module
    docstring); the tuple is one allocation a recorded call."""
    Args = namedtuple(f"{name}_args", [a.name for a in schema_arguments(overload)])
    make = Args._make

    def bound(ctx, inputs, output):
        return setup_context(ctx, make(inputs), output)

    bound.__doc__ = setup_context.__doc__
    return bound


def define_op(schema, impl, fake, backward=None, setup_context=None, remedy=None):
    """Register operator `schema` ("name(Tensor x, ...) -> Tensor") in our namespace and return it
    as an Op: torch.ops.llmk.name, which runs `impl` on real tensors and `fake` under
    torch.compile's tracing (both take the schema's arguments in order).

    backward, setup_context: its autograd formula, as torch.library.register_autograd takes them:
    setup_context(ctx, inputs, output) saves what the backward needs (ctx.save_for_backward, plain
    attributes), inputs bound by the schema's names; backward(ctx, *grad_outputs) returns one
    gradient (or None) per schema argument.
    Without them the op is forward-only; remedy: how else to get gradients, for its error."""
    name = schema.split("(", 1)[0]
    lib = _library()
    lib.define(schema)
    for key in ("CPU", "CUDA"):  # CPU: the interpreter lane's tensors
        lib.impl(name, impl, key)
    torch.library.register_fake(f"{NAMESPACE}::{name}", fake, lib=lib)
    overload = getattr(getattr(torch.ops, NAMESPACE), name).default
    function = None
    if backward is None:
        lib.impl(name, _forward_only_kernel(name, overload, remedy), "Autograd", with_keyset=True)
    else:
        setup_context = _bound_by_name(name, overload, setup_context)
        torch.library.register_autograd(f"{NAMESPACE}::{name}", backward, setup_context=setup_context, lib=lib)
        function = _autograd_function(name, impl, setup_context, backward)
    OPS[name] = Op(name, impl, overload, function, remedy)
    return OPS[name]


def no_outputs(*args):
    """The fake implementation of an `_out` operator: it returns nothing."""
    return None


def define_ops(name, args, empty, into, outs=("out",), backward=None, setup_context=None, options=""):
    """The two operators of a kernel that writes outputs it is given: `name(args, options) -> Tensor`
    (a tuple of Tensors for several outs) and `name_out(args, Tensor(a!) out, ..., options) -> ()`.

    args: the schema's arguments ("Tensor x, Tensor weight, float eps"). empty(*args, *options):
    the new output(s) of the functional op. It is the fake implementation too (under torch.compile's
    tracing its torch.empty makes fake tensors), so the fake's shapes, dtypes and strides are the
    kernel's by construction. into(*args, *outs, *options): the kernel writing them, the `_out`
    op's body. outs: the names of the written buffers in the `_out` op's schema.
    options: arguments with defaults that come after the buffers in the `_out` op's schema (added
    to an op after callers passed its buffers by position), "" for none.
    backward, setup_context: the functional op's autograd formula (define_op); the `_out` op is
    forward-only (it writes a caller's buffer), and its error then says to call `name` without
    the buffers.
    Returns (functional Op, _out Op)."""
    returns = "Tensor" if len(outs) == 1 else f"({', '.join(['Tensor'] * len(outs))})"
    written = ", ".join(f"Tensor({chr(ord('a') + i)}!) {out}" for i, out in enumerate(outs))
    n_args = len(args.split(","))
    tail = f", {options}" if options else ""

    if options:  # the buffers go between the arguments and the options

        def impl(*a):
            made = empty(*a)
            into(*a[:n_args], *((made,) if len(outs) == 1 else made), *a[n_args:])
            return made
    elif len(outs) == 1:  # no slicing on the calls of every other op: this runs on each eager call

        def impl(*a):
            made = empty(*a)
            into(*a, made)
            return made
    else:

        def impl(*a):
            made = empty(*a)
            into(*a, *made)
            return made

    return (
        define_op(f"{name}({args}{tail}) -> {returns}", impl, empty, backward, setup_context),
        define_op(
            f"{name}_out({args}, {written}{tail}) -> ()",
            into,
            no_outputs,
            remedy=f"call {name} without {'/'.join(outs)}= to get gradients" if backward else None,
        ),
    )
