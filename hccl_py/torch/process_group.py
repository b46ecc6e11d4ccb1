"""The ``"hccl"`` process group: torch.distributed's collectives on a hccl-py communicator.

torch calls these methods directly (``dist.all_reduce(t)`` is ``group.allreduce([t], opts)``); C++
callers (DDP, functional collectives) reach the ones torch's Python trampoline forwards. Each
method maps onto one hccl-py call on numpy views of the tensors (``tensors.py``):

====================================  =========================================================
torch                                 hccl-py
====================================  =========================================================
all_reduce (SUM/PRODUCT/MIN/MAX/AVG)  all_reduce (AVG: SUM, then divided by the group size)
broadcast, reduce                     broadcast, reduce
all_gather (list), gather             all_gather / gather into one staging tensor, then rows
all_gather_into_tensor (_single)      all_gather(out=)
reduce_scatter (list)                 reduce_scatter of the concatenated list
reduce_scatter_tensor (_single)       reduce_scatter(out=)
all_to_all_single (splits)            all_to_all (equal blocks), all_to_all_v (split sizes)
all_to_all (lists)                    all_to_all_v on the concatenated lists
scatter                               scatter of the stacked list
*_coalesced, _coalescing_manager      one hccl-py call per tensor (or per output/input pair),
                                      every one checked before the first is issued; one Work
send/recv/isend/irecv                 send/recv, always asynchronous (batch_isend_irecv posts
                                      them one by one: a send never waits for the peer's recv)
barrier, monitored_barrier            barrier, barrier(monitored=True)
====================================  =========================================================

``async_op=False`` runs the call on the caller's thread and returns a shared finished Work;
``async_op=True`` issues hccl-py's asynchronous call and returns an :class:`HcclWork`. HCCL's
errors are raised as ``torch.distributed.DistBackendError`` with HCCL's message.
"""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist

from ..errors import HcclError, HcclNotSupportedError, HcclParamError
from . import device as _device
from .args import (
    FAST_OP_TYPE,
    OPS,
    check_list,
    check_numel,
    check_pair,
    check_pairs,
    divide,
    one_dtype,
    one_tensor,
    reduce_op,
    split_sizes,
)
from .npu import charge_kernels
from .self_loop import SelfLoop
from .tensors import Staged, as_array, check, contiguous_array, same_device, strict
from .work import DONE, HcclWork, backend_error, group_end, group_start

_F32 = torch.float32
_NO_TIMEOUT = timedelta(0)


class HcclProcessGroup(dist.ProcessGroup):
    """A torch process group whose collectives run on the hccl-py communicator ``comm`` (its
    ranks in group-rank order). Made by the registered backend (``init_process_group("hccl")``,
    ``new_group``); ``monitor`` makes the communicator of a monitored barrier with a given
    timeout (seconds), ``on_shutdown`` releases the communicator."""

    def __init__(self, comm, *, monitor=None, on_shutdown=None):
        super().__init__(comm.rank, comm.size)
        self.comm = comm
        self._all_reduce_what = f"all_reduce on '{comm.name}'"
        self._monitor = monitor
        self._on_shutdown = on_shutdown
        self._group_name = ""
        self._group_desc = ""
        self._serves_cpu = not strict()  # under hccl-npu, as Ascend's: npu tensors only
        # torch ops on npu tensors are charged to the card before each call (the npu device's)
        self._charge = charge_kernels if _device.installed() is not None else None
        self._loop = SelfLoop(comm)  # sends to and receives from this rank itself (batch_isend_irecv allows them)
        self._coalescing = False  # between _start_coalescing and _end_coalescing

    # -- identity (what torch's C++ side asks) -----------------------------------------------
    def getBackendName(self) -> str:
        """ "hccl": what ``pg.name()`` and ``dist.get_backend()`` report."""
        return "hccl"

    def setGroupName(self, name: str) -> None:
        """torch names the group ("0", "1", ...) when it registers it."""
        self._group_name = name

    def getGroupName(self) -> str:
        """The name torch gave the group (functional collectives look groups up by it)."""
        return self._group_name

    def setGroupDesc(self, desc: str) -> None:
        """torch describes the group ("default_pg", "undefined", or new_group(group_desc=))."""
        self._group_desc = desc

    def getGroupDesc(self) -> str:
        """The description torch gave the group."""
        return self._group_desc

    supports_splitting = False  # torch's eager init asks (init_process_group(device_id=)); new groups are made anew

    def _get_backend(self, device=None) -> "HcclProcessGroup":
        """The backend serving ``device``'s tensors: this group for every device it serves."""
        return self

    @property
    def _device_types(self) -> list:
        """The devices the group serves, as torch asks for object collectives and barriers: the npu
        alone under hccl-npu (Ascend's "hccl" serves no CPU tensors), else torch's answer."""
        if strict():
            return [torch.device("npu")]
        return dist.ProcessGroup._device_types.__get__(self)

    def __repr__(self) -> str:
        return f"<HcclProcessGroup {self._group_name or '?'} on {self.comm!r}>"

    def shutdown(self) -> None:
        """destroy_process_group(): the communicator is released (its queued calls end first)."""
        if self._on_shutdown is not None:
            callback, self._on_shutdown = self._on_shutdown, None
            callback()

    def abort(self) -> None:
        self.comm.abort("torch aborted the process group")

    # -- groups: HCCL's group start/end, torch's coalescing ---------------------------------------------------
    def _group_start(self) -> None:
        """torch_npu's ``backend._group_start()`` (HcclGroupStart): the asynchronous calls this thread
        issues until ``_group_end()`` complete together (``work.group_start``)."""
        group_start()

    def _group_end(self) -> None:
        """torch_npu's ``backend._group_end()`` (HcclGroupEnd): closes the group ``_group_start`` opened."""
        try:
            group_end()
        except HcclError as err:
            raise backend_error(err, "_group_end") from err

    def _start_coalescing(self, device) -> None:
        """torch's ``_coalescing_manager(group, device)`` begins: its calls form one group (as
        torch_npu's and NCCL's backends open one)."""
        if self._coalescing:
            raise backend_error(
                HcclParamError(
                    "_start_coalescing: this group is already coalescing; end it first",
                    arg="device",
                    rule="not coalescing",
                    value=str(device),
                ),
                "_start_coalescing",
            )
        self._coalescing = True
        group_start()

    def _end_coalescing(self, device) -> dist.Work:
        """torch's coalescing manager ends: the Work of every asynchronous call made in it."""
        if not self._coalescing:
            raise backend_error(
                HcclParamError(
                    "_end_coalescing without _start_coalescing", arg="device", rule="coalescing", value=str(device)
                ),
                "_end_coalescing",
            )
        self._coalescing = False
        try:
            return group_end()
        except HcclError as err:
            raise backend_error(err, "_end_coalescing") from err

    # -- the one issue path --------------------------------------------------------------------
    def _call(self, what: str, async_op: bool, prep, *args, spends: int = 1):
        """``prep(what, *args)`` checks the arguments and returns (issue, post, result):
        ``issue(async_op)`` starts the hccl-py call (returning its Work when asynchronous),
        ``post()`` (or None) runs once it succeeded, ``result`` is what the future holds.
        ``spends``: the communicator's call numbers the call takes on the other ranks (an
        all-to-all-v two: its exchange of counts, then its data), which a refusal spends too."""
        if self._charge is not None:
            self._charge()
        try:
            issue, post, result = prep(what, *args)
        except HcclError as err:
            raise self._refused(err, what, times=spends) from err
        try:
            if not async_op:
                issue(False)
                if post is not None:
                    post()
                return DONE
            return HcclWork(what, [issue(True)], result, post)
        except HcclError as err:
            raise backend_error(err, what) from err

    def _one(self, tensors: list, what: str) -> torch.Tensor:
        """The one tensor of a collective's list argument; a refusal on every rank else."""
        try:
            return one_tensor(tensors, what)
        except HcclError as err:
            raise self._refused(err, what) from err

    def _refused(self, err: HcclError, what: str, times: int = 1, **peer) -> Exception:
        """This rank's own check refused a call before it reached the communicator: refuse it on
        every rank that takes part (``Communicator.refuse``; ``peer``: ``send_to``/``recv_from``
        for point to point; ``times``: the communicator calls it stands for), so theirs fails with
        this error instead of waiting; the error to raise."""
        try:
            for _ in range(times):
                self.comm.refuse(err, **peer)
        except HcclError:
            pass  # a second thread, or a closed communicator: nothing more to tell
        return backend_error(err, what)

    def _coalesced(self, what: str, opts, prep, calls, result: list, count: int):
        """Several calls of one kind as one torch call (``*_coalesced``): one Work for all.
        ``calls()`` gives each call's arguments for ``prep`` (it may refuse the whole call); every
        call is checked and prepared before the first is issued, so a refusal moves no byte.
        ``count``: how many calls the other ranks issue (one per input); a refusal spends as many."""
        if self._charge is not None:
            self._charge()
        try:
            prepared = [prep(what, *args) for args in calls()]
        except HcclError as err:
            raise self._refused(err, what, times=max(count, 1)) from err
        try:
            posts = [post for _, post, _ in prepared if post is not None]

            def post_all():
                for post in posts:
                    post()

            if opts is not None and not opts.asyncOp:
                for index, (issue, _, _) in enumerate(prepared):
                    try:
                        issue(False)
                    except HcclError as err:
                        # the calls after it are refused here too, as the others issue (or refuse)
                        # every call of theirs: the ranks stay in step
                        raise self._refused(err, what, times=len(prepared) - index - 1) from err
                post_all()
                return DONE
            return HcclWork(what, [issue(True) for issue, _, _ in prepared], result, post_all)
        except HcclError as err:
            raise backend_error(err, what) from err

    # -- collectives ---------------------------------------------------------------------------------
    def allreduce(self, tensors, opts=None):
        opts = opts if opts is not None else dist.AllreduceOptions()
        if self._charge is not None:
            self._charge()
        if not opts.asyncOp and len(tensors) == 1:  # the common case, kept short: blocking float32, one tensor
            t = tensors[0]
            on_device = t.is_cpu and self._serves_cpu or t.device.type == "npu" and t.storage_offset() == 0
            if t.dtype is _F32 and on_device and t.is_contiguous() and not t.requires_grad:
                red_op = opts.reduceOp
                found = OPS.get(hash(red_op)) if type(red_op) is FAST_OP_TYPE else None
                if found is not None:
                    a = t.numpy() if t.is_cpu else as_array(t)  # the tensor's memory: C-contiguous, writable, float32
                    try:
                        flat = a if a.ndim == 1 else a.reshape(-1)
                        self.comm.all_reduce_flat(flat, found[0], self._all_reduce_what, 1 if found[1] else 0)
                    except HcclError as err:
                        raise backend_error(err, "all_reduce") from err
                    if found[1]:
                        t.div_(self.comm.size)
                    return DONE
        return self._call("all_reduce", opts.asyncOp, self._allreduce, self._one(tensors, "all_reduce"), opts.reduceOp)

    def _reduced(self, t, red_op, what: str, keep: bool = True):
        """A reduction into ``t``: (its staging, hccl-py's op, the call's ``then`` ("average" for
        AVG: every rank must share it), what runs after the call: the result copied back into
        ``t`` and, for AVG, divided by the group size; nothing unless ``keep``, as on a non-root
        of reduce)."""
        staged = Staged(t, what)
        op, then = reduce_op(red_op, t.dtype, what)

        def post():
            if keep:
                staged.copy_back()
                if then is True:
                    divide(t, self.comm.size)
                elif then is not False:  # a premul factor (0.0 included)
                    with torch.no_grad():
                        t.mul_(then)

        return staged, op, "average" if then is True else "", post

    def _allreduce(self, what, t, red_op):
        staged, op, step, post = self._reduced(t, red_op, what)
        return lambda a: self.comm.all_reduce(staged.array, op, async_op=a, then=step), post, [t]

    def allreduce_coalesced(self, tensors, opts=None):
        """Each tensor all-reduced with ``opts.reduceOp``; one dtype across the list (as torch's
        ``all_reduce_coalesced`` and gloo ask)."""
        opts = opts if opts is not None else dist.AllreduceCoalescedOptions()
        what = "all_reduce_coalesced"

        def calls():
            one_dtype(tensors, what, "tensors")
            return [(t, opts.reduceOp) for t in tensors]

        return self._coalesced(what, opts, self._allreduce, calls, list(tensors), len(tensors))

    def broadcast(self, tensors, opts=None):
        opts = opts if opts is not None else dist.BroadcastOptions()
        return self._call("broadcast", opts.asyncOp, self._broadcast, self._one(tensors, "broadcast"), opts.rootRank)

    def _broadcast(self, what, t, root):
        staged = Staged(t, what)
        # the root's tensor is only read: nothing to write back (it may be an expanded, stride-0 view)
        post = None if self.comm.rank == root else staged.copy_back
        return lambda a: self.comm.broadcast(staged.array, root, async_op=a), post, [t]

    def reduce(self, tensors, opts=None):
        opts = opts if opts is not None else dist.ReduceOptions()
        return self._call(
            "reduce", opts.asyncOp, self._reduce, self._one(tensors, "reduce"), opts.rootRank, opts.reduceOp
        )

    def _reduce(self, what, t, root, red_op):
        staged, op, step, post = self._reduced(t, red_op, what, keep=self.comm.rank == root)
        return lambda a: self.comm.reduce(staged.array, root, op, async_op=a, then=step), post, [t]

    def allgather(self, output_tensors, input_tensors, opts=None):
        opts = opts if opts is not None else dist.AllgatherOptions()
        return self._call(
            "all_gather",
            opts.asyncOp,
            self._allgather,
            self._one(output_tensors, "all_gather"),
            self._one(input_tensors, "all_gather"),
        )

    def _allgather(self, what, outs, t, arg="tensor_list"):
        same_device(outs, t, what, "all_gather")
        if t.device.type == "npu" and len(outs) == self.comm.size and any(o.numel() != t.numel() for o in outs):
            return self._allgather_uneven(what, outs, t)
        check_list(outs, t, self.comm.size, what, arg, outputs=True)
        x = contiguous_array(t, what)
        buffer = torch.empty((self.comm.size, *t.shape), dtype=t.dtype, device=t.device)

        def post():
            with torch.no_grad():
                for o, row in zip(outs, buffer):
                    o.copy_(row)

        # the future holds the list itself, as gloo's
        return lambda a: self.comm.all_gather(x, out=as_array(buffer), async_op=a), post, outs

    def _allgather_uneven(self, what, outs, t):
        """torch_npu's all_gather of tensors of other sizes per rank (``tensor_list[r]`` has rank r's
        size): ``all_gather_v``, whose signature carries the sizes, so ranks whose lists disagree
        get a call mismatch, not data."""
        check(t, what)
        for o in outs:
            check(o, what)
            if o.dtype != t.dtype:
                raise HcclParamError(
                    f"{what}: tensor_list holds {o.dtype}; the input is {t.dtype}",
                    arg="tensor_list",
                    value=str(o.dtype),
                    expected=str(t.dtype),
                    rule="dtype",
                )
        mine = outs[self.comm.rank].numel()
        if mine != t.numel():
            raise HcclParamError(
                f"{what}: tensor_list[{self.comm.rank}] (this rank's) holds {mine} elements; the input has {t.numel()}",
                arg="tensor_list",
                value=mine,
                expected=t.numel(),
                rule="size",
            )
        counts = [o.numel() for o in outs]
        x = contiguous_array(t, what).reshape(-1)
        buffer = torch.empty((self.comm.size, max(counts)), dtype=t.dtype, device=t.device)

        def post():
            with torch.no_grad():
                for o, row in zip(outs, buffer):
                    o.copy_(row[: o.numel()].view(o.shape))

        return lambda a: self.comm.all_gather_v(x, counts, out=as_array(buffer), async_op=a), post, outs

    def allgather_coalesced(self, output_lists, input_list, opts=None):
        """torch's layout, the same in ``dist.all_gather_coalesced`` and here: ``output_lists`` has
        one list per rank, each with one tensor per input; ``output_lists[r][i]`` receives rank r's
        ``input_list[i]``. One all_gather per input, into that input's column of the lists."""
        what = "all_gather_coalesced"

        def calls():
            n, k = self.comm.size, len(input_list)
            one_dtype(input_list, what, "input_tensor_list")
            if len(output_lists) != n:
                raise HcclParamError(
                    f"{what}: output_tensor_lists has {len(output_lists)} lists; expected one per "
                    f"rank ({n}), each with one tensor per input",
                    arg="output_tensor_lists",
                    value=len(output_lists),
                    rule="length",
                    expected=n,
                )
            for r, outs in enumerate(output_lists):
                if len(outs) != k:
                    raise HcclParamError(
                        f"{what}: output_tensor_lists[{r}] has {len(outs)} tensors; expected one per input ({k})",
                        arg="output_tensor_lists",
                        value=len(outs),
                        rule="length",
                        expected=k,
                    )
                for i, (o, t) in enumerate(zip(outs, input_list)):
                    check_pair(o, t, t.numel(), what, f"output_tensor_lists[{r}][{i}]", f"input_tensor_list[{i}]")
            return [([outs[i] for outs in output_lists], t, "output_tensor_lists") for i, t in enumerate(input_list)]

        return self._coalesced(what, opts, self._allgather, calls, list(output_lists), len(input_list))

    def all_gather_single(self, output, input, opts=None):
        opts = opts if opts is not None else dist.AllgatherOptions()
        return self._call("all_gather_into_tensor", opts.asyncOp, self._all_gather_single, output, input)

    def _all_gather_single(self, what, output, input):
        same_device([output], input, what, "all_gather_into_tensor")
        staged = Staged(output, what)
        x = contiguous_array(input, what)
        check_numel(output, input.numel() * self.comm.size, what, "output")
        return lambda a: self.comm.all_gather(x, out=staged.array, async_op=a), staged.copy_back, [output]

    _allgather_base = all_gather_single  # the names before torch 2.13

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        """``outputs[i]`` (the group size times ``inputs[i]``'s elements) gathers every rank's
        ``inputs[i]``: one all_gather per pair (pairs may differ in dtype; torch's coalescing manager
        sends its all_gather_into_tensor calls here)."""
        what = "all_gather_into_tensor_coalesced"
        return self._coalesced(
            what,
            opts,
            self._all_gather_single,
            lambda: check_pairs(outputs, inputs, lambda x: x.numel() * self.comm.size, what, ("outputs", "inputs")),
            list(outputs),
            len(inputs),
        )

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def gather(self, output_tensors, input_tensors, opts=None):
        opts = opts if opts is not None else dist.GatherOptions()
        return self._call(
            "gather", opts.asyncOp, self._gather, output_tensors, self._one(input_tensors, "gather"), opts.rootRank
        )

    def _gather(self, what, output_tensors, t, root):
        x = contiguous_array(t, what)
        if self.comm.rank != root:
            return lambda a: self.comm.gather(x, root, async_op=a), None, output_tensors
        outs = one_tensor(output_tensors, what)
        same_device(outs, t, what, "gather")
        check_list(outs, t, self.comm.size, what, "gather_list", outputs=True)
        buffer = torch.empty((self.comm.size, *t.shape), dtype=t.dtype, device=t.device)

        def post():
            with torch.no_grad():
                for o, row in zip(outs, buffer):
                    o.copy_(row)

        return lambda a: self.comm.gather(x, root, out=as_array(buffer), async_op=a), post, output_tensors

    def scatter(self, output_tensors, input_tensors, opts=None):
        opts = opts if opts is not None else dist.ScatterOptions()
        return self._call(
            "scatter", opts.asyncOp, self._scatter, self._one(output_tensors, "scatter"), input_tensors, opts.rootRank
        )

    def _scatter(self, what, t, input_tensors, root):
        staged = Staged(t, what)
        x = None
        if self.comm.rank == root:
            ins = one_tensor(input_tensors, what)
            same_device(ins, t, what, "scatter")
            check_list(ins, t, self.comm.size, what, "scatter_list")
            x = as_array(torch.stack([i.detach() for i in ins]))
        return lambda a: self.comm.scatter(x, root, out=staged.array, async_op=a), staged.copy_back, [t]

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        return self._call(
            "reduce_scatter",
            opts.asyncOp,
            self._reduce_scatter,
            self._one(output_tensors, "reduce_scatter"),
            self._one(input_tensors, "reduce_scatter"),
            opts.reduceOp,
        )

    def _reduce_scatter(self, what, t, ins, red_op):
        same_device(ins, t, what, "reduce_scatter")
        if (
            t.device.type == "npu"
            and len(ins) == self.comm.size
            and ins[self.comm.rank].numel() == t.numel()
            and any(i.numel() != t.numel() for i in ins)
        ):
            return self._reduce_scatter_uneven(what, t, ins, red_op)
        if strict() and ins and (len(ins) != self.comm.size or any(i.numel() != t.numel() for i in ins)):
            return self._reduce_scatter_lifted(what, t, ins, red_op)
        check_list(ins, t, self.comm.size, what, "input_list")
        y = as_array(torch.cat([i.detach().reshape(-1) for i in ins]))
        return self._reduce_scatter_into(what, t, y, red_op)

    def _reduce_scatter_uneven(self, what, t, ins, red_op):
        """torch_npu's reduce_scatter of blocks of other sizes (``input_list[r]`` is rank r's block,
        ``output`` this rank's size): ``reduce_scatter_v``, whose signature carries the sizes, so
        ranks whose lists disagree get a call mismatch, not data."""
        for i in ins:
            check(i, what)
            if i.dtype != t.dtype:
                raise HcclParamError(
                    f"{what}: input_list holds {i.dtype}; the output is {t.dtype}",
                    arg="input_list",
                    value=str(i.dtype),
                    expected=str(t.dtype),
                    rule="dtype",
                )
        counts = [i.numel() for i in ins]
        if t.numel() != counts[self.comm.rank]:
            raise HcclParamError(
                f"{what}: output holds {t.numel()} elements; input_list[{self.comm.rank}] (this rank's block) "
                f"{counts[self.comm.rank]}",
                arg="output",
                value=t.numel(),
                expected=counts[self.comm.rank],
                rule="size",
            )
        y = as_array(torch.cat([i.detach().reshape(-1) for i in ins]))
        block = torch.empty(max(counts), dtype=t.dtype, device=t.device)
        staged, op, step, post = self._reduced(block, red_op, what)

        def finish():
            post()
            with torch.no_grad():
                t.copy_(block[: t.numel()].view(t.shape))

        return (
            lambda a: self.comm.reduce_scatter_v(y, counts, op, out=staged.array, async_op=a, then=step),
            finish,
            [t],
        )

    def _reduce_scatter_lifted(self, what, t, ins, red_op):
        """torch_npu's reduce_scatter of an input list whose length is not the group's, or whose
        tensors are not of the output's size (Atlas A2 and later): the list flattened end to end, cut or zero-padded to the group size times the
        output, and reduce-scattered; rank r gets the r-th block."""
        for i in ins:
            check(i, what)
            if i.dtype != t.dtype:
                raise HcclParamError(
                    f"{what}: input_list holds {i.dtype}; the output is {t.dtype}",
                    arg="input_list",
                    value=str(i.dtype),
                    expected=str(t.dtype),
                    rule="dtype",
                )
        flat = torch.cat([i.detach().reshape(-1) for i in ins])
        total = t.numel() * self.comm.size
        lifted = torch.zeros(total, dtype=t.dtype, device=t.device)
        lifted[: min(total, flat.numel())] = flat[:total]
        return self._reduce_scatter_into(what, t, as_array(lifted), red_op)

    def _reduce_scatter_into(self, what, output, y, red_op):
        staged, op, step, post = self._reduced(output, red_op, what)
        return lambda a: self.comm.reduce_scatter(y, op, out=staged.array, async_op=a, then=step), post, [output]

    def reduce_scatter_single(self, output, input, opts=None):
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        return self._call(
            "reduce_scatter_tensor", opts.asyncOp, self._reduce_scatter_single, output, input, opts.reduceOp
        )

    def _reduce_scatter_single(self, what, output, input, red_op):
        same_device([output], input, what, "reduce_scatter_tensor")
        check_numel(input, output.numel() * self.comm.size, what, "input")
        return self._reduce_scatter_into(what, output, contiguous_array(input, what), red_op)

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        """``outputs[i]`` gets this rank's block of ``inputs[i]`` (the group size times its elements)
        reduced over the ranks: one reduce_scatter per pair (pairs may differ in dtype; torch's
        coalescing manager sends its reduce_scatter_tensor calls here)."""
        red_op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        what = "reduce_scatter_tensor_coalesced"
        n = self.comm.size

        def calls():
            pairs = check_pairs(inputs, outputs, lambda o: o.numel() * n, what, ("inputs", "outputs"))
            return [(o, i, red_op) for i, o in pairs]

        return self._coalesced(what, opts, self._reduce_scatter_single, calls, list(outputs), len(inputs))

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        opts = opts if opts is not None else dist.AllToAllOptions()
        even = (
            not output_split_sizes
            and not input_split_sizes
            and output.shape == input.shape
            and input.dim()
            and input.shape[0] % self.comm.size == 0
        )
        return self._call(
            "all_to_all_single",
            opts.asyncOp,
            self._all_to_all_single,
            output,
            input,
            output_split_sizes,
            input_split_sizes,
            spends=1 if even else 2,  # the other ranks' all_to_all or all_to_all_v (counts, then data)
        )

    def _all_to_all_single(self, what, output, input, output_split_sizes, input_split_sizes):
        same_device([output], input, what, "all_to_all_single")
        n = self.comm.size
        staged = Staged(output, what)
        x = contiguous_array(input, what)
        if output.dtype != input.dtype:
            raise HcclParamError(
                f"{what}: output is {output.dtype}, input {input.dtype}",
                arg="output",
                value=str(output.dtype),
                expected=str(input.dtype),
            )
        if (
            not output_split_sizes
            and not input_split_sizes
            and output.shape == input.shape
            and input.dim()
            and input.shape[0] % n == 0
        ):
            return (
                lambda a: self.comm.all_to_all(x.reshape(n, -1), out=staged.array.reshape(n, -1), async_op=a),
                staged.copy_back,
                [output],
            )
        rows_in, rows_out = (input.shape[0] if input.dim() else 1), (output.shape[0] if output.dim() else 1)
        send = split_sizes(input_split_sizes, input.numel() // max(rows_in, 1), n, rows_in, what, "input")
        recv = split_sizes(output_split_sizes, output.numel() // max(rows_out, 1), n, rows_out, what, "output")
        return (
            lambda a: self.comm.all_to_all_v(
                x.reshape(-1), send, None, staged.array.reshape(-1), recv, None, async_op=a
            ),
            staged.copy_back,
            [output],
        )

    alltoall_base = all_to_all_single

    def alltoall(self, output_tensors, input_tensors, opts=None):
        opts = opts if opts is not None else dist.AllToAllOptions()
        return self._call("all_to_all", opts.asyncOp, self._alltoall, output_tensors, input_tensors, spends=2)

    def _alltoall(self, what, output_tensors, input_tensors):
        n = self.comm.size
        if len(output_tensors) != n or len(input_tensors) != n:
            raise HcclParamError(
                f"{what}: takes {n} output and {n} input tensors (one per rank), got "
                f"{len(output_tensors)} and {len(input_tensors)}",
                arg="tensor lists",
                rule="length",
                expected=n,
            )
        for t in (*output_tensors, *input_tensors):
            check(t, what)
        same_device([*output_tensors, *input_tensors[1:]], input_tensors[0], what, "all_to_all")
        dtypes = {t.dtype for t in (*output_tensors, *input_tensors)}
        if len(dtypes) > 1:
            raise HcclParamError(
                f"{what}: tensors of several dtypes {sorted(map(str, dtypes))}", arg="tensors", rule="dtype"
            )
        send = as_array(torch.cat([t.detach().reshape(-1) for t in input_tensors]))
        buffer = torch.empty(
            sum(t.numel() for t in output_tensors), dtype=output_tensors[0].dtype, device=output_tensors[0].device
        )
        send_counts = [t.numel() for t in input_tensors]
        recv_counts = [t.numel() for t in output_tensors]

        def post():
            with torch.no_grad():
                for o, part in zip(output_tensors, buffer.split(recv_counts)):
                    o.copy_(part.view(o.shape))

        return (
            lambda a: self.comm.all_to_all_v(send, send_counts, None, as_array(buffer), recv_counts, None, async_op=a),
            post,
            output_tensors,
        )

    # -- point to point: always asynchronous (torch's send and isend both call this) ----------------------
    def send(self, tensors, dstRank, tag=0):
        what = f"send to {dstRank}"
        try:
            t = one_tensor(tensors, what)
            if dstRank == self.comm.rank:
                return self._loop.send(t, what)
            x = contiguous_array(t, what)
        except HcclError as err:
            raise self._refused(err, what, send_to=dstRank) from err
        try:
            return HcclWork(what, [self.comm.send(x, dstRank, async_op=True)], list(tensors))
        except HcclError as err:
            raise backend_error(err, what) from err

    def recv(self, tensors, srcRank, tag=0):
        what = f"recv from {srcRank}"
        try:
            t = one_tensor(tensors, what)
            if srcRank == self.comm.rank:
                return self._loop.recv(t, what)
            staged = Staged(t, what)
        except HcclError as err:
            raise self._refused(err, what, recv_from=srcRank) from err
        try:
            return HcclWork(
                what, [self.comm.recv(staged.array, srcRank, async_op=True)], list(tensors), staged.copy_back
            )
        except HcclError as err:
            raise backend_error(err, what) from err

    def recv_anysource(self, tensors, tag=0):
        raise backend_error(
            HcclNotSupportedError(
                "recv without a source rank is not supported: HCCL's receives name their peer; pass src",
                rule="required",
                arg="src",
            ),
            "recv",
        )

    # -- barriers --------------------------------------------------------------------------------
    def barrier(self, opts=None):
        """All ranks of the group entered; ``dist.barrier(timeout=)`` bounds the wait here."""
        opts = opts if opts is not None else dist.BarrierOptions()

        def issue(what):
            return lambda a: self.comm.barrier(async_op=a), None, []

        if opts.timeout < _NO_TIMEOUT:  # not given (torch's kUnsetTimeout): the group's HCCL_EXEC_TIMEOUT applies
            return self._call("barrier", opts.asyncOp, issue)
        work = self._call("barrier", True, issue)
        if opts.asyncOp:
            return work
        work.wait(opts.timeout)
        return DONE

    def monitored_barrier(self, timeout: timedelta | None = None, wait_all_ranks: bool = False) -> None:
        """torch's monitored barrier: every rank reports to rank 0, which names every rank that
        did not arrive within ``timeout`` (default: the group's HCCL_EXEC_TIMEOUT); the other
        ranks raise with rank 0's finding. All missing ranks are named (``wait_all_ranks`` is
        implied). torch's ``dist.monitored_barrier`` refuses backends other than gloo before it
        reaches a group, so call this method (``group.monitored_barrier(...)``) or
        ``hccl_py.torch.monitored_barrier``."""
        comm = (
            self._monitor(timeout.total_seconds()) if timeout is not None and self._monitor is not None else None
        ) or self.comm
        try:
            comm.barrier(monitored=True)
        except HcclError as err:
            raise backend_error(err, "monitored_barrier") from err

    # -- checks ----------------------------------------------------------------------------------------
