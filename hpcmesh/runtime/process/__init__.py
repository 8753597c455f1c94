"""The process half of the runtime: what starts, keeps and ends the processes of a mesh.

The host agent (``host_agent``, run by ``agent_main``/``agent_serve``, Monarch's name for it
in ``worker``), its fork server (``zygote`` on the agent's side, ``forkserver`` the zygote
itself), the actor process's main (``proc``) and its lease (``lease_watchdog``), how a
process is started (``bootstrap``) and bound to GPUs (``gpu_binding``), what its agent undoes
after it (``exit_actions``), and the process-level tuning of the controller and the actor
processes (``placement``, ``tuning``). The message path these processes run is the rest of
``hpcmesh.runtime``; this package imports it, never the other way but for the controller's
``client``, which runs a host agent in its own process for ``this_host()``.

Imports nothing here: each module is loaded by what needs it.
"""
