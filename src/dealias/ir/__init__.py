"""What the passes share: the plan types, op facts from aten schemas, view steps and their inverses, region writes,
the ops dealias puts in graphs (autograd bookkeeping, index checks), node building and trace printing."""
