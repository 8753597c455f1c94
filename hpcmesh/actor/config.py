"""``hpcmesh.actor.config``: Monarch's ``monarch.actor.config``, settings of the actor API
that a program sets by assignment (``config.prefix_python_logs_with_actor = False``).

``prefix_python_logs_with_actor``: whether an actor's stdout lines and ``logging`` records
carry the name of the actor that wrote them (Monarch's prefixes); True by default, as in
Monarch 0.7.0.
"""

prefix_python_logs_with_actor: bool = True
