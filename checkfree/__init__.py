"""checkfree: training LLMs through pipeline-stage failures (CheckFree / CheckFree+, Blagoev, Ersoy, Chen, 2025)."""

import logging

PACKAGE_LOG = logging.getLogger(__name__)
"""The package's logger, which every module's ``getLogger(__name__)`` propagates to: the commands set their
handlers (console, ``rank<R>.log``, ``supervisor.log``) and level here, once for every module."""
