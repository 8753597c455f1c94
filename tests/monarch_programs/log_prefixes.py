"""An actor's logging records carry Monarch's prefix, [actor=<module.Class mesh{point}>],
while monarch.actor.config.prefix_python_logs_with_actor is true."""
import io
import logging

from monarch.actor import Actor, config, endpoint, this_host


class Talker(Actor):
    def __init__(self):
        self.out = io.StringIO()
        handler = logging.StreamHandler(self.out)
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        logging.getLogger("talk").addHandler(handler)

    @endpoint
    def talk(self, word: str) -> list[str]:
        logging.getLogger("talk").warning("said %s", word)
        logging.getLogger("talk").warning("")          # an empty message stays empty
        lines, self.out = self.out.getvalue().splitlines(), io.StringIO()
        logging.getLogger("talk").handlers[0].setStream(self.out)
        return lines

    @endpoint
    def prefix(self, on: bool) -> None:
        config.prefix_python_logs_with_actor = on


def describe(line: str) -> str:
    head, _, message = line.partition(": ")
    if not message.startswith("[actor="):
        return f"{head}: {message!r} (no prefix)"
    actor, _, rest = message[len("[actor="):].partition("] ")
    return (f"{head}: prefixed, names Talker: {'Talker talkers' in actor}, "
            f"ends {actor[actor.index(' talkers'):]!r}; message {rest!r}")


if __name__ == "__main__":
    print("default:", config.prefix_python_logs_with_actor)
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    talkers = procs.spawn("talkers", Talker)
    for point, lines in talkers.talk.call("hello").get().items():
        for line in lines:
            print(point, describe(line))
    talkers.prefix.call(False).get()
    for point, lines in talkers.talk.call("plain").get().items():
        for line in lines:
            print(point, describe(line))
    procs.stop().get()
