"""Running a compiled program: the torch executor, the fused (inductor) executor, the per-call epilogue, and the
comparison with eager behind verify=True."""
