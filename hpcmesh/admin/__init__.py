"""The admin view of a job: an HTTP server on the controller showing hosts, processes,
actors and stacks (``job.enable_admin()``; see the README's "Admin view")."""
