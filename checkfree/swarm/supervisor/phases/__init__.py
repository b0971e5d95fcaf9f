"""The phases of the supervisor's loop (checkfree.swarm.supervisor.supervisor ``Supervisor.drive``), one per file.

Each phase decides from the supervisor's state, the reports received and the clock, and returns the actions to
take and the phase to be in next (checkfree.swarm.supervisor.phases.base); it never waits, sends or journals. A
fresh run goes ``starting`` → (``storing the initial checkpoint``) → ``training begins`` → then, per attempt,
``between attempts`` → (``waiting for returns``) → (``recovering`` → (``rolling back``) → ``recovered``) →
``attempt`` → ``after a commit`` (→ ``validating``) → ``between attempts`` …, and at the target (or the schedule's
end) (``validating``) → ``gathering the model`` → ``shutting down``. A resumed run enters ``resuming`` (the
adoption wait), then ``adopting`` (the verdict), (``finishing a commit``), ``resumed``, and goes on in the same
phases from the journaled state. ``commit in flight`` follows a stop signal in an attempt's commit phase;
``fetching weights`` serves tests (:meth:`Supervisor.fetch_weights`).
"""
