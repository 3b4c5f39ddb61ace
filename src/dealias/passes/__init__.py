"""The compiler, one graph at a time: pipeline.py runs capture -> alias analysis -> functionalize -> optimize ->
write-back lowering, checking invariants between passes, and hands the result to an executor."""
