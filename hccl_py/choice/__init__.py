"""Which algorithm serves a call: what a name means (``algo=`` and ``HCCL_ALGO``'s grammar,
:mod:`.names`), HCCL's own selection rules (:mod:`.hccl_rules`), the cost model's argmin where no
rule is known (:mod:`.argmin`), and ``auto`` over the two (:mod:`.select`)."""
