"""Self-check scripts at Accelerate's `accelerate.test_utils.scripts` paths, each with a `main()` that runs in every
process of a launch (`debug_launcher(test_ops.main)`, or `hasten launch path/to/test_ops.py`). They are hasten's
own checks, not copies of Accelerate's: each raises AssertionError naming the rank and the values on a mismatch."""
