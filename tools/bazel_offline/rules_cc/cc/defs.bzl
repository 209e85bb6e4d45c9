"""Offline stand-in for @rules_cc, used only by `make bazel-check`.

Bazel 4.2.3 loads @rules_cc while it resolves toolchains for py_binary and
py_test, and would download it. Our Python targets need none of its C++ logic,
so each macro below hands its arguments to the rule built into Bazel 4.
"""

def cc_library(**attrs):
    native.cc_library(**attrs)

def cc_binary(**attrs):
    native.cc_binary(**attrs)

def cc_test(**attrs):
    native.cc_test(**attrs)

def cc_proto_library(**attrs):
    native.cc_proto_library(**attrs)

def cc_toolchain(**attrs):
    native.cc_toolchain(**attrs)

def cc_toolchain_suite(**attrs):
    native.cc_toolchain_suite(**attrs)

def objc_library(**attrs):
    native.objc_library(**attrs)
