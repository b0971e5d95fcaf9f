"""One schema per file checkfree reads, and the limits every such file is held to before it is parsed.

Each module here is one concept: :mod:`.limits` (size and nesting depth, checked on the text before any parser
runs, so a file nested 100,000 deep or a YAML alias bomb never reaches a recursive parser or an expansion),
:mod:`.fields` (bounded, finite field types shared by the schemas), :mod:`.errors` (a schema's first complaint as
one sentence naming the file, the field, the value and what was expected), and one module per file format
(:mod:`.run_files`: throughput.json and summary.json as ``swarm table`` and the report read them;
:mod:`.revocations`: ``revocations.json``; :mod:`.locations`: the swarm's WAN table, ``locations.json``). The model config and the swarm config keep their typed dataclasses
(checkfree.config, checkfree.swarm.config): the bounds sit on their fields and the schema is derived from them.

The schema library is pydantic v2 (strict mode, unknown keys forbidden where the format is ours): it is the field's
default, well kept, validates stdlib dataclasses and typed dicts alike, and its errors carry the field's path and
the value, which :mod:`.errors` turns into one sentence. This package imports no other part of checkfree.
"""
