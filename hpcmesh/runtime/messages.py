"""Every message the runtime sends, in one place: codes, field order, builders, encodings.

What travels is a flat tuple whose first field is a ``MSG_*`` code, pickled by the C
pickler (``pickle.dumps`` of builtin values is the fastest encoding Python has; a class per
message would cost a ``__reduce__`` per message and tie the wire to a class's layout, which
is how an earlier wire version broke old peers). The tuples' layouts are defined here and
nowhere else: build them with the ``*_msg`` functions, read a call's fields by unpacking in
the order of ``call_msg``'s parameters. Two hot paths write a tuple out instead of calling
its builder (``Node.call_actor``, ``Node.reply_to``: a Python call is ~2 % of a pipelined
call's CPU); they say so where they do. A change to any layout is a new
``framing.MAGIC`` (peers of another version are refused at the handshake).

No I/O here: the node (``node.py``) sends and receives these, the actor host reads calls.
"""

from __future__ import annotations

import pickle
import traceback
from dataclasses import dataclass
from typing import Any

from ..errors import HpcmeshError
from ..transport import serialization
from ..transport.framing import check_frame_limits

PROTOCOL = serialization.PROTOCOL
is_plain = serialization.is_plain
frozen_size = serialization.frozen_size

MSG_HELLO = 0      # (HELLO, node_id, addresses, info)
MSG_CALL = 1       # (CALL, actor_id, endpoint, payload, reply_port_id|None, rank, extent_items)
#                   payload = pickled (args, kwargs) whose out-of-band buffers ride in the
#                   frame, or the (args, kwargs) tuple itself when it holds only builtin
#                   values (pickled with the envelope); the reply goes to the sending
#                   node's port reply_port_id.
MSG_DELIVER = 2    # (DELIVER, port_id, value)  -- value pickled with the envelope: plain
#                   results, runtime events, channel messages
MSG_RPC = 3        # (RPC, service, args, reply PortRef|None)
MSG_FAIL = 4       # (FAIL, port_id, exception)  -- reply carrying an error
MSG_RESULT = 5     # (RESULT, port_id, pickled value) -- a reply whose value is pickled on
#                   its own, its out-of-band buffers in the frame: the receiver unpickles
#                   it apart from the envelope, so a value it cannot unpickle fails that
#                   one call; every endpoint result that is not plain goes this way
MSG_CAST = 6       # (CAST, actor_id, endpoint, payload, extent_items, members, ports, seqs,
#                   hold)
#                   one call to several actors of one host, sent to its host agent, which
#                   hands each member a MSG_CALL (``runtime/relay.py``): ``payload`` as in
#                   MSG_CALL (its buffers in the frame, once for all), ``members`` a tuple
#                   of (proc_name, node_id, addresses, rank) (or that tuple pickled),
#                   ``ports`` the sender's reply port for each, or one port for them all
#                   (an int: a call()'s host share, ``runtime/host_share.py``), or None (a
#                   broadcast), ``seqs`` with a port per member, the number this cast was
#                   relayed under, for each (numbers from one sender only grow; else None);
#                   ``hold``: a call() the sender waits on alone through this agent, whose
#                   answers the agent may hold until they are all in (``relay_windows.HOLD``)
MSG_CAST_REPLY = 7  # (CAST_REPLY, [(port_id, kind, value, nbufs, seq)]): a host agent's
#                   folded answers to casts; kind MSG_DELIVER (value), MSG_FAIL (an
#                   exception) or MSG_RESULT (a pickled value the agent never unpickled, its
#                   ``nbufs`` out-of-band buffers next in the frame's); ``seq`` the call's
#                   number (its ``seqs`` entry), or for a host share's port the member's
#                   position in the cast's ``members`` (-1: all of them)
MSG_CAST_TREE = 8  # (CAST_TREE, reply_to, actor_id, endpoint, payload, extent_items, share,
#                   subtrees, up, hold): a cast through a tree of host agents (``relay.py``):
#                   the agent forwards each of ``subtrees`` [(agent node_id, addresses,
#                   share, subtrees)] to its agent, then hands its own ``share`` (members,
#                   ports, seqs as in MSG_CAST; members may come pickled, None: none here)
#                   their calls; answers go to ``up`` where it is set (the agent that
#                   forwarded this cast: (node_id, addresses, token)), as MSG_CAST_UP, else
#                   straight to ``reply_to`` (the sender's (node_id, addresses)); ``hold``
#                   as MSG_CAST's, for the whole tree
MSG_CAST_UP = 9    # (CAST_UP, sender_id, token, entries, answers): an agent's folded answers
#                   passed up the tree to the agent that forwarded it the cast, which folds
#                   them with its own (``token``: where that agent sends them); ``entries``
#                   as MSG_CAST_REPLY's, ``answers`` how many members' answers they settle
MSG_RESULTS = 10   # an entry's kind only (MSG_CAST_REPLY, MSG_CAST_UP): (port_id, RESULTS,
#                   values, 0, positions): members of one host share that answered with a
#                   pickled value and no out-of-band buffers; ``values`` one bytes per
#                   position, or a single one for all of them (alike)
MSG_VALUES = 11    # the same for plain values (MSG_DELIVER's, pickled with the envelope);
#                   a single value for all positions only where it is an immutable scalar

#: Where a call's fields sit (for the few places that read one field, not all).
CALL_ACTOR, CALL_ENDPOINT, CALL_PAYLOAD, CALL_REPLY, CALL_RANK, CALL_EXTENT = range(1, 7)


@dataclass(frozen=True, slots=True)
class NodeRef:
    """How to reach a node: its id and the addresses it advertises, best first."""
    node_id: str
    addresses: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class PortRef:
    """A mailbox on some node; sending to it delivers a value to the owner's callback."""
    node: NodeRef
    port_id: int


# Supervision events: what processes and actors report to their owner's events port, as
# (kind, ...) tuples delivered with MSG_DELIVER.
EVENT_LOG = "log"                          # (LOG, proc_name, stream, [lines])
# (LOG_FOLDED, window, [(stream, text, count, [proc_name])]): alike lines a host folded
EVENT_LOG_FOLDED = "log_folded"
# (EXIT, proc_name, pid, returncode, hostname, cause, stop_asked): cause is (failure class,
# why) where the agent could tell what ended it (the OOM killer, NCCL's watchdog), else None;
# stop_asked: the agent was asked to stop it
EVENT_EXIT = "exit"
EVENT_ACTOR_FAULT = "actor_fault"          # (ACTOR_FAULT, actor_id, MeshFailure)
EVENT_AGENT_EXIT = "agent_exit"            # (AGENT_EXIT, agent_node_id, hostname, reason)
# (AGENT_NOTICE, agent_node_id, hostname, what): a signal the agent takes as a notice, not a
# stop (SIGTERM in a Slurm step: the job is being preempted or ended); it goes on serving
EVENT_AGENT_NOTICE = "agent_notice"


#: Each kind's name and how many fields its messages have, the code included.
_FIELDS = {MSG_HELLO: ("hello", 4), MSG_CALL: ("call", 7), MSG_DELIVER: ("deliver", 3),
           MSG_RPC: ("rpc", 4), MSG_FAIL: ("fail", 3), MSG_RESULT: ("result", 3),
           MSG_CAST: ("cast", 9), MSG_CAST_REPLY: ("cast reply", 2),
           MSG_CAST_TREE: ("cast tree", 10), MSG_CAST_UP: ("cast up", 5)}


def layout_problem(msg: tuple) -> str | None:
    """What breaks the layout of a message a peer sent, None if nothing does. Not checked
    on the way in (every message would pay for it): asked once handling one has raised, to
    tell a malformed message (the peer's doing) from a bug in its handler (this side's)."""
    kind = msg[0]
    if type(kind) is not int or kind not in _FIELDS:
        return f"a message of unknown kind {kind!r}"
    name, fields = _FIELDS[kind]
    if len(msg) != fields:
        return f"a {name} message of {len(msg)} fields, not {fields}"
    expected = {MSG_CALL: (str, str, object, (int, type(None)), int, (tuple, type(None))),
                MSG_DELIVER: (int, object), MSG_FAIL: (int, BaseException),
                MSG_RESULT: (int, (bytes, bytearray)),
                MSG_RPC: (str, tuple, (PortRef, type(None))),
                MSG_CAST: (str, str, object, (tuple, type(None)), (tuple, bytes),
                           (list, int, type(None)), (list, type(None)), bool),
                MSG_CAST_REPLY: (list,),
                MSG_CAST_TREE: (tuple, str, str, object, (tuple, type(None)), tuple, list,
                                (tuple, type(None)), bool),
                MSG_CAST_UP: (str, int, list, int),
                }.get(kind, ())
    for i, (value, types) in enumerate(zip(msg[1:], expected), 1):
        if not isinstance(value, types):
            return f"field {i} of a {name} message is a {type(value).__name__}"
    return None


def hello_msg(node_id: str, addresses: tuple[str, ...], info: dict) -> tuple:
    return (MSG_HELLO, node_id, addresses, info)


def call_msg(actor_id: str, endpoint: str, payload: Any, reply_port: int | None,
             rank: int, extent_items: tuple | None) -> tuple:
    return (MSG_CALL, actor_id, endpoint, payload, reply_port, rank, extent_items)


def cast_msg(actor_id: str, endpoint: str, payload: Any, extent_items: tuple | None,
             members: tuple, ports: list | None, seqs: list, hold: bool = False) -> tuple:
    return (MSG_CAST, actor_id, endpoint, payload, extent_items, members, ports, seqs, hold)


def cast_reply_msg(entries: list) -> tuple:
    return (MSG_CAST_REPLY, entries)


def deliver_msg(port_id: int, value: Any) -> tuple:
    return (MSG_DELIVER, port_id, value)


def fail_msg(port_id: int, exc: BaseException) -> tuple:
    return (MSG_FAIL, port_id, exc)


def rpc_msg(service: str, args: tuple, reply: Any) -> tuple:
    return (MSG_RPC, service, args, reply)


def decode_args(payload: Any, buffers: list) -> tuple[tuple, dict]:
    """A call's ``(args, kwargs)``: sent inline when it held only builtin values, else
    pickled apart, with its out-of-band buffers in the frame."""
    return payload if type(payload) is tuple else serialization.loads(payload, buffers)


#: A message whose pickled size may be over this is checked against the frame limits
#: (``framing.check_frame_limits``) before it is queued; below it no frame can break them.
CHECK_LIMITS_OVER = 1 << 20


class ReplyNotSent(serialization.SerializationError):
    """A result that could not be pickled or framed for its caller (the call fails with
    this; the connection and the actor are unharmed)."""


class BatchShare(list):
    """The out-of-band buffers of a message that came in a batch frame (none: a batch
    carries none), with its share of the frame's bytes: about what it took on the wire,
    known without looking at its arguments (the telemetry's ``messages.bytes``)."""
    __slots__ = ("msg_bytes",)

    def __init__(self, msg_bytes: int):
        super().__init__()
        self.msg_bytes = msg_bytes


class MessageNotReceived(HpcmeshError, MemoryError):
    """A call's arguments or a result arrived with a buffer this process could not allocate
    (out of memory): that one call fails with this; the connection goes on."""


def encode_result(port_id: int, value: Any, what: str = "result") -> tuple[bytes, list]:
    """The frame (meta, out-of-band buffers) that answers port ``port_id`` with ``value``:
    one encoding for every reply path. Anything that goes wrong here, a value that does
    not pickle, whose ``__reduce__`` raises, too many buffers for a frame, no memory,
    raises :class:`ReplyNotSent` before a byte is queued."""
    try:
        if is_plain(value):
            meta = pickle.dumps((MSG_DELIVER, port_id, value), PROTOCOL)
            if len(meta) > CHECK_LIMITS_OVER:
                check_frame_limits(len(meta))      # a huge string, say
            return meta, []
        inner, bufs = serialization.dumps(value, what)
        check_frame_limits(len(inner) + 32, bufs)
        return serialization.dumps_envelope((MSG_RESULT, port_id, inner)), bufs
    except Exception as e:  # noqa: BLE001 - whatever it was, this one call fails with it
        raise ReplyNotSent(f"the {what} ({type(value).__name__}) could not be sent: "
                           f"{describe_exception(e)}") from None


def unreadable_result(sender: str, exc: BaseException) -> "Failure":
    """What a call fails with whose result arrived from ``sender`` but cannot be unpickled
    here (``exc``): that call alone, the connection goes on."""
    return Failure(serialization.SerializationError(
        f"a result arrived from {sender} but cannot be unpickled here: "
        f"{describe_exception(exc)}. A result must unpickle on the caller (an exception class "
        f"whose __init__ takes other arguments than it passes to Exception.__init__ does not; "
        f"return plain data)"))


def describe_exception(exc: BaseException, with_type: bool = True) -> str:
    """``Type: message`` of an exception (or the message alone), even one whose
    ``__str__`` raises: error paths must not fail on the error they report."""
    try:
        text = str(exc)
    except Exception as e:  # noqa: BLE001
        text = f"<str() of this {type(exc).__name__} raised {type(e).__name__}>"
    if not with_type:
        return text
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def format_exception(exc: BaseException) -> str:
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))


class Failure:
    """Marks a value delivered to a reply port as an error (never sent as such: it
    becomes a MSG_FAIL on the wire)."""
    __slots__ = ("exc",)

    def __init__(self, exc: BaseException):
        self.exc = exc


def failure(exc: BaseException) -> Failure:
    return Failure(exc)


class _AnsweredThroughPort:
    """What an ``explicit_response_port`` endpoint returns: it answered through its port."""
    __slots__ = ()

    def __repr__(self) -> str:
        return "ANSWERED_THROUGH_PORT"

    def __reduce__(self):
        return "ANSWERED_THROUGH_PORT"     # the one instance, even inside a shipped class


ANSWERED_THROUGH_PORT = _AnsweredThroughPort()
