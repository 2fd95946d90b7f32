"""placeholder: being written"""


class ReductionRules:
    pass
