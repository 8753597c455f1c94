"""The observing half of the runtime: what a process records and shows about itself.

The telemetry buffers every process keeps (``telemetry_recorder``, off by default) and the
spans users open (``spans``, re-exported by ``hpcmesh.telemetry``), this host's GPUs as
nvidia-smi reports them (``nvidia_smi``), the admin view's process side (``introspect``:
actors, stacks, py-spy) and ``breakpoint()`` as a remote pdb session (``debugger``), and the
folding of alike log lines (``log_fold``) and the console of a process that owns meshes,
which prints its processes' lines (``console``). ``hpcmesh.telemetry`` and
``hpcmesh.admin`` are the controller's half of the same extensions. The message path hooks
in here (the actor host and the client record calls, fold logs, print); nothing here
imports ``runtime.process``.

Imports nothing here: each module is loaded by what needs it.
"""
