ENV_NAMES = ("quickstart", "bfcl")
