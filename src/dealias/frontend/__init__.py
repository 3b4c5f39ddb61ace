"""The front end around TorchDynamo: the backend dynamo calls per graph (one program per input layout,
keyed and guarded), graphs split around what runs eagerly, and the per-call guard keys."""
