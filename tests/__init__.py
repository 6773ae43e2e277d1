import os

if os.environ.get("TRITON_INTERPRET") == "1":   # a check module under Triton's interpreter
    from tests.interpreter_scans import vectorise

    vectorise()
