"""Offline stand-in for @rules_java, used only by `make bazel-check`.

Bazel 4.2.3 loads @rules_java while it registers its JDK toolchains, and would
download it. Each macro below hands its arguments to the rule built into Bazel 4.
"""

def java_library(**attrs):
    native.java_library(**attrs)

def java_binary(**attrs):
    native.java_binary(**attrs)

def java_test(**attrs):
    native.java_test(**attrs)

def java_import(**attrs):
    native.java_import(**attrs)

def java_plugin(**attrs):
    native.java_plugin(**attrs)

def java_proto_library(**attrs):
    native.java_proto_library(**attrs)

def java_toolchain(**attrs):
    native.java_toolchain(**attrs)

def java_runtime(**attrs):
    native.java_runtime(**attrs)
