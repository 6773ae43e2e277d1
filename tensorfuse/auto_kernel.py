"""The kernel ``tf.compile`` hands out for a program a template takes: per call's sizes (and the
scalars that decide), the first native template that fits, else the Triton template, else the
floor's stages or TVM's default schedule; per call's tensors, the route to the program in their
memory order where they lie in another (:mod:`.memory_order`)."""
from __future__ import annotations

from .binding import CallBinder, bind_call, check_named_sizes, signature_key, split_scalars
from .compiled import CompiledKernel
from .torch_graph import GraphCallable


class AutoKernel(GraphCallable):
    """A template kernel where it fits the call's sizes, the default schedule where it does not
    (e.g. a feature axis too wide for one tile). Decided once per shape signature."""

    def __init__(self, template, fallback: CompiledKernel, ahead: tuple = (), floor=None,
                 refused: list | None = None):
        self.template, self.fallback, self.ahead = template, fallback, tuple(ahead)
        # (name, reason) of native templates that refused the program at any sizes
        self.refused = list(refused or [])
        # floor(why): the stages to run where the template does not fit (made once), or None
        self.floor, self._floor = floor, None
        self.program, self.target = fallback.program, fallback.target
        self.description = ", else ".join([k.description for k in self.ahead]
                                          + [template.description, fallback.description])
        self._fits: dict = {}
        # per key of _fits: why the template did not fit those sizes (the floor's stages or TVM's
        # schedule run them: schedule_origin tells which by the kernel chosen)
        self._why_not: dict = {}
        self._warned = False   # that TVM's schedule runs some sizes (said once)
        self._by_shapes: dict = {}
        self._fast: dict = {}   # signature key -> the chosen kernel's FastCall, where it has one
        # scalars whose values decide whether a native template runs a call (a map's width,
        # radius, dilation: whether its patches fit TMA boxes): part of the choice's key
        choice = dict.fromkeys(n for k in self.ahead for n in getattr(k, "choice_scalars", ()))
        names = [p.name for p in self.program.params]
        self._choice_at = tuple((n, names.index(n)) for n in choice)

    def __repr__(self) -> str:
        return f"<AutoKernel {self.program.name} for {self.target.name}: {self.description}>"

    def for_sizes(self, scalars: dict | None = None, **dims):
        """The kernel used at these sizes (scalar values may be given by name among them, or as
        ``scalars``): the first of the native templates (``ahead``) that fits them and prefers
        them, else the Triton template where it fits, else the default schedule."""
        dims, named = split_scalars(self.program, dims)
        scalars = {**(named or {}), **(scalars or {})}
        key = self._fits_key(dims, scalars)
        if key not in self._fits:
            from .errors import TargetError

            # a size misspelt or left out: said here, not as a template's KeyError
            check_named_sizes(self.program, dims, complete=True)
            found = next((k for k in self.ahead if k.fits(scalars or None, **dims)), None)
            if hasattr(found, "kernel_at"):   # a route holding a kernel per sizes
                found = found.kernel_at(**dims)
            if found is None:
                try:
                    self.template.build(**dims)
                    found = self.template
                except TargetError as exc:
                    found = self._floor_for(exc, dims) or self.fallback
                    self._why_not[key] = str(exc)
                    if found is self.fallback:   # the floor's stages say so themselves
                        self._warn_untemplated(exc, dims)
            self._fits[key] = found
        return self._fits[key]

    def runs_natively(self, scalars: dict | None = None, **dims) -> bool:
        """Whether a native template (one of ``ahead``) runs these sizes — not the Triton
        template, TVM's schedule or the floor's stages."""
        return self.for_sizes(scalars, **dims) not in (self.template, self.fallback,
                                                        self._floor or None)

    def _floor_for(self, exc: Exception, dims: dict):
        """The floor's stages (:func:`_floor`), made on the first sizes that need them."""
        if self._floor is None and self.floor is not None:
            sizes, _ = split_scalars(self.program, dims)
            self._floor = self.floor(f"the {self.template.description} does not fit some "
                                     f"sizes ({exc})", sizes) or False
        return self._floor or None

    def _pick(self, args, kwargs, key=False):
        """The kernel for this call, decided once per signature (this runs on every call: it only
        looks at the arguments' kinds when it has seen them before), and the signature's key."""
        if key is False:
            key = self._key(args, kwargs)
        chosen = self._by_shapes.get(key) if key is not None else None
        if chosen is None:
            self.target.device()  # a missing GPU is the first thing to report
            kind = "cpu" if self.target.kind == "llvm" else self.target.kind
            bound = bind_call(self.program, args, kwargs, kind)
            chosen = self.for_sizes(bound.scalars, **bound.dims)
            if key is not None:
                self._by_shapes[key] = chosen
                # the chosen kernel's binding of this call copies this one
                binder = chosen._binder() if hasattr(chosen, "_binder") else \
                    getattr(chosen, "_calls", None)
                if isinstance(binder, CallBinder) and binder.program is self.program and \
                        binder.target_device == kind:
                    binder.remember(key, bound)
        return chosen, key

    def _key(self, args: tuple, kwargs: dict) -> tuple | None:
        """The call's signature key, with the values of the scalars that decide the kernel."""
        key = signature_key(args, kwargs)
        if key is None or not self._choice_at:
            return key
        return key + tuple(kwargs[n] if n in kwargs else args[i] if i < len(args) else None
                           for n, i in self._choice_at)

    def invoke(self, key, args: tuple, kwargs: dict):
        """A call (``key``: its signature key, ``False`` when not made yet)."""
        if key is False or self._choice_at:
            key = self._key(args, kwargs)
        fast = self._fast.get(key)
        if fast is not None:          # a signature seen before: straight to its launches
            done = fast(args, kwargs)
            if done is not None:
                return done
        routed, out = self._route_call(key, args, kwargs)
        if routed:
            return out
        chosen, key = self._pick(args, kwargs, key)
        out = chosen.invoke(key, args, kwargs)
        made = getattr(chosen, "_fast", {}).get(key)
        if made is not None:
            self._fast[key] = made
        return out

    def source(self, **dims) -> str:
        """Generated source at these sizes: the Triton kernel, or TVM's CUDA if the template does
        not fit them."""
        chosen = self.for_sizes(**dims)
        return chosen.cuda_source(**dims) if chosen is self.fallback else chosen.source(**dims)

    def assembly(self, **dims) -> str:
        return self.for_sizes(**dims).assembly(**dims)

    def _fits_key(self, sizes: dict, scalars: dict) -> tuple:
        """What :meth:`for_sizes` decides by: the sizes and the scalars that choose a kernel."""
        return tuple(sorted(sizes.items())) + tuple((n, scalars.get(n)) for n, _ in self._choice_at)

    def _warn_untemplated(self, exc: Exception, dims: dict) -> None:
        """That TVM's default schedule runs these sizes and why, warned once per kernel (a
        :class:`~tensorfuse.errors.NoTemplateWarning`: it can be far slower than torch)."""
        import warnings

        from .errors import NoTemplateWarning

        if not self._warned:
            self._warned = True
            sizes = ", ".join(f"{n}={v}" for n, v in dims.items())
            warnings.warn(f"tensorfuse.compile: {self.template.description} does not take "
                          f"{self.program.name} at {sizes} ({exc}); those sizes run on TVM's "
                          "default GPU schedule, which can be far slower than torch",
                          NoTemplateWarning, stacklevel=4)

    def schedule_origin(self, **dims) -> str:
        """Whether these sizes run on template defaults or a tuned record — or, where the
        template does not fit them, on TVM's default schedule, and why; scalar values given by
        name among them (a window, a prefix length) pick the record kept for those values."""
        sizes, named = split_scalars(self.program, dims)
        chosen = self.for_sizes(**dims)
        if chosen is not self.fallback:
            return chosen.schedule_origin(**dims)
        why = self._why_not.get(self._fits_key(sizes, named or {}))
        origin = chosen.schedule_origin(**sizes)
        if not why:
            return origin
        tvm = "TVM's default GPU schedule" if origin == "template defaults" else \
            f"TVM's schedule from a {origin}"
        return f"{tvm}: the {self.template.description} does not fit these sizes ({why})"

    def describe_plan(self, scalars: dict | None = None, **dims) -> str:
        """Which kernel runs these sizes (scalar values given as ``scalars`` or by name among
        them), why each one before it in the order of choice does not — a head dim the Hopper
        attention does not take runs on the Triton template, and this says so; a native template
        that refused the program whatever its sizes, with its reason —, and its plan."""
        sizes, named = split_scalars(self.program, dims)
        named = {**(named or {}), **(scalars or {})} or None
        dims = {**sizes, **(named or {})}
        chosen = self.for_sizes(**dims)
        lines = [f"{self.program.name} at " + ", ".join(f"{n}={v}" for n, v in sizes.items())
                 + f": {getattr(chosen, 'description', type(chosen).__name__)}"]
        lines += [f"  not {name} (at any sizes): {why}" for name, why in self.refused]
        for k in self.ahead:
            if k.fits(named or None, **sizes):
                break
            line = f"  not {k.description}: {_why_not_native(k, named, sizes)}"
            lines += [line] if line not in lines else []   # (routes of one kind say it once)
        else:
            if chosen is not self.template:
                why = self._why_not.get(self._fits_key(sizes, named or {}))
                lines.append(f"  not the {self.template.description}"
                             + (f": {why}" if why else ""))
        lines.append(chosen.describe_plan(named, **sizes))
        return "\n".join(lines)

    def benchmark(self, *args, **kwargs) -> float:
        return self._pick(args, kwargs)[0].benchmark(*args, **kwargs)

    def cache_info(self) -> list:
        """The sources built so far (:class:`~tensorfuse.targets.triton.size_builds.Build`: the
        sizes each serves, exactly or as arguments): the native templates' (their kernels read
        every size as an argument) and the Triton template's. Sizes no template fits are built
        by TVM per sizes, and not listed."""
        routed = self.routes.cache_info() if self.routes is not None else []
        return [b for k in (*self.ahead, self.template) if hasattr(k, "cache_info")
                for b in k.cache_info()] + routed


def _why_not_native(kernel, scalars: dict | None, sizes: dict) -> str:
    """Why a native template's kernel does not run these sizes: its refusal, or that another
    kernel is preferred for them."""
    from .errors import ScheduleError, TargetError

    preferred = getattr(kernel, "preferred", None)
    if preferred is not None and not preferred(sizes):
        return "another kernel is preferred at these sizes"
    reason = kernel.why_not(scalars, **sizes) if hasattr(kernel, "why_not") else None
    if reason:   # a route that knows its own reason
        return reason
    try:
        if hasattr(kernel, "launches"):
            kernel.launches(scalars, **sizes)
    except (ScheduleError, TargetError) as exc:
        return str(exc)
    return "it does not take these sizes"
