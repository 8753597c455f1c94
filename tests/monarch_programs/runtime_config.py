"""monarch.config: configure / configured / get_runtime_config around a small mesh."""

from monarch.actor import Actor, endpoint, this_host
from monarch.config import configure, configured, get_global_config, get_runtime_config


class Echo(Actor):
    @endpoint
    def echo(self, x: int) -> int:
        return x


def main() -> None:
    configure(enable_log_forwarding=False)
    print("runtime layer has it:", get_runtime_config()["enable_log_forwarding"])
    with configured(enable_log_forwarding=True) as merged:
        print("inside configured:", merged["enable_log_forwarding"])
        print("global view agrees:", get_global_config()["enable_log_forwarding"])
    print("after configured:", get_runtime_config()["enable_log_forwarding"])
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    print("echo:", procs.spawn("echo", Echo).echo.call(7).get().values())
    procs.stop().get()


if __name__ == "__main__":
    main()
