"""What the gates need besides a build, shipped with the package so that ``pip install dcaforge``
alone runs every gate: the tiny random-weight model recipes (:mod:`.tiny`, ``recipe: tiny:<arch>``),
and the logits dumper ``dca_logits.cpp`` with the helper that compiles it against a build's static
libraries (:mod:`.build_logits`)."""
