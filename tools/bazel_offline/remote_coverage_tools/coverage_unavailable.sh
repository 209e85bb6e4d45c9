#!/bin/sh
echo "bazel coverage is not available in the offline disco-xla build" >&2
exit 1
