"""Acting in the envs: the local collector (every algorithm, and testing) and collector=ray's workers."""
