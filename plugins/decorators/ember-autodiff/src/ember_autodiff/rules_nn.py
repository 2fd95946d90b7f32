"""placeholder: being written"""


class NNRules:
    pass
