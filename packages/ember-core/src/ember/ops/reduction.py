"""placeholder: being written"""
__all__: list[str] = []
TENSOR_METHODS: dict = {}
