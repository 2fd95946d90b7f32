"""placeholder: being written"""


class MovementRules:
    pass
