"""HloModuleProto message classes, built at run time without TensorFlow.

We declare only the subset of XLA's `hlo.proto` / `xla_data.proto` that the graph
view and the rewrite passes read or write. Everything else in a module (layouts'
tiling, schedules, stack frames, backend configs, ...) is kept by protobuf as
unknown fields, so a parse and re-serialise keeps it.

Field numbers are XLA's (read off `tensorflow.compiler.xla.service.hlo_pb2`
descriptors from tensorflow-cpu 2.21). Enum-typed fields are declared as plain
int32: they are varints on the wire, and an int keeps values we do not know.
"""

from __future__ import annotations

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

_PACKAGE = "disco_xla.hlo"

# (name, number, type, repeated). type is a scalar type name or a message name.
_MESSAGES: dict[str, list[tuple[str, int, str, bool]]] = {
    # The wrapper XLA writes for `--xla_dump_hlo_as_proto` (with buffer assignment).
    "HloProto": [("hlo_module", 1, "HloModuleProto", False)],
    "HloModuleProto": [
        ("name", 1, "string", False),
        ("entry_computation_name", 2, "string", False),
        ("computations", 3, "HloComputationProto", True),
        ("host_program_shape", 4, "ProgramShapeProto", False),
        ("id", 5, "int64", False),
        ("entry_computation_id", 6, "int64", False),
        # An HloScheduleProto, kept serialised: a rewrite drops it (`drop_schedule`).
        ("schedule", 7, "bytes", False),
        # An HloInputOutputAliasProto (TF's assigned variables), kept serialised:
        # the runners clear it to run a step repeatedly on the same arguments.
        ("input_output_alias", 8, "bytes", False),
        ("device_assignment", 15, "DeviceAssignmentProto", False),
        # An HloBufferDonorProto, kept serialised: the parameters a multi-process
        # JAX step donates without naming the output that reuses them.
        ("buffer_donor", 18, "bytes", False),
    ],
    "HloComputationProto": [
        ("name", 1, "string", False),
        ("instructions", 2, "HloInstructionProto", True),
        ("program_shape", 4, "ProgramShapeProto", False),
        ("id", 5, "int64", False),
        ("root_id", 6, "int64", False),
        ("is_fusion_computation", 7, "bool", False),
    ],
    "HloInstructionProto": [
        ("name", 1, "string", False),
        ("opcode", 2, "string", False),
        ("shape", 3, "ShapeProto", False),
        ("metadata", 7, "OpMetadata", False),
        ("literal", 8, "LiteralProto", False),
        ("parameter_number", 9, "int64", False),
        ("fusion_kind", 11, "string", False),
        ("tuple_index", 13, "int64", False),
        ("dimensions", 14, "int64", True),
        ("window", 15, "Window", False),
        ("convolution_dimension_numbers", 16, "ConvolutionDimensionNumbers", False),
        ("slice_dimensions", 17, "SliceDimensions", True),
        ("dynamic_slice_sizes", 20, "int64", True),
        ("channel_id", 26, "int64", False),
        ("custom_call_target", 28, "string", False),
        ("dot_dimension_numbers", 30, "DotDimensionNumbers", False),
        ("id", 35, "int64", False),
        ("operand_ids", 36, "int64", True),
        ("control_predecessor_ids", 37, "int64", True),
        ("called_computation_ids", 38, "int64", True),
        ("sharding", 40, "OpSharding", False),
        ("replica_groups", 49, "ReplicaGroup", True),
        ("feature_group_count", 50, "int64", False),
        ("batch_group_count", 58, "int64", False),
        ("frontend_attributes", 68, "FrontendAttributes", False),
        ("use_global_device_ids", 71, "bool", False),
        ("collective_device_list", 87, "CollectiveDeviceListProto", False),
        ("iota_collective_device_list", 92, "IotaReplicaGroupListProto", False),
        # Groups as axes of a device mesh (XLA's SPMD partitioner writes these).
        ("mesh_axes_replica_group_list", 93, "MeshAxesReplicaGroupListProto", False),
        ("backend_config", 43, "bytes", False),  # JSON: a while's known_trip_count
        ("comparison_direction", 63, "string", False),  # "LT", "LE", ...
    ],
    "SliceDimensions": [
        ("start", 1, "int64", False),
        ("limit", 2, "int64", False),
        ("stride", 3, "int64", False),
    ],
    "ShapeProto": [
        ("element_type", 2, "int32", False),
        ("dimensions", 3, "int64", True),
        ("tuple_shapes", 4, "ShapeProto", True),
        ("layout", 5, "LayoutProto", False),
        ("is_dynamic_dimension", 6, "bool", True),
    ],
    "ProgramShapeProto": [
        ("parameters", 1, "ShapeProto", True),
        ("result", 2, "ShapeProto", False),
        ("parameter_names", 3, "string", True),
    ],
    "LiteralProto": [
        ("shape", 1, "ShapeProto", False),
        ("f32s", 8, "float", True),
        ("s32s", 4, "int32", True),
        ("s64s", 5, "int64", True),
        ("u32s", 6, "int32", True),
    ],
    "LayoutProto": [("minor_to_major", 1, "int64", True)],
    "OpMetadata": [
        ("op_type", 1, "string", False),
        ("op_name", 2, "string", False),
        ("source_file", 3, "string", False),
        ("source_line", 4, "int32", False),
    ],
    "Window": [("dimensions", 1, "WindowDimension", True)],
    "WindowDimension": [
        ("size", 1, "int64", False),
        ("stride", 2, "int64", False),
        ("padding_low", 3, "int64", False),
        ("padding_high", 4, "int64", False),
        ("window_dilation", 5, "int64", False),
        ("base_dilation", 6, "int64", False),
    ],
    "ConvolutionDimensionNumbers": [
        ("kernel_input_feature_dimension", 3, "int64", False),
        ("kernel_output_feature_dimension", 4, "int64", False),
        ("kernel_spatial_dimensions", 6, "int64", True),
        ("input_batch_dimension", 7, "int64", False),
        ("input_feature_dimension", 8, "int64", False),
        ("output_batch_dimension", 9, "int64", False),
        ("output_feature_dimension", 10, "int64", False),
        ("input_spatial_dimensions", 11, "int64", True),
        ("output_spatial_dimensions", 12, "int64", True),
    ],
    "DotDimensionNumbers": [
        ("lhs_contracting_dimensions", 1, "int64", True),
        ("rhs_contracting_dimensions", 2, "int64", True),
        ("lhs_batch_dimensions", 3, "int64", True),
        ("rhs_batch_dimensions", 4, "int64", True),
    ],
    "ReplicaGroup": [("replica_ids", 1, "int64", True)],
    "IotaReplicaGroupListProto": [
        ("num_replica_groups", 1, "int64", False),
        ("num_devices_per_group", 2, "int64", False),
        ("iota_reshape_dims", 3, "int64", True),
        ("iota_transpose_perm", 4, "int32", True),
    ],
    "MeshAxesReplicaGroupListProto": [
        ("mesh", 1, "MeshProto", False),
        ("axes", 2, "AxisRefProto", True),  # the axes a group spans
    ],
    "MeshProto": [
        ("axes", 1, "MeshAxisProto", True),
        ("device_ids", 2, "int64", True),  # explicit ids in mesh order
        # Or as an iota: arange(prod).reshape(dims).transpose(perm), printed
        # `device_ids=([2,2]T(1,0))`; neither: 0, 1, ... in mesh order.
        ("iota_device_ids", 3, "IotaDeviceIdsProto", False),
    ],
    "IotaDeviceIdsProto": [
        ("reshape_dims", 1, "int64", True),
        ("transpose_perm", 2, "int64", True),
    ],
    "MeshAxisProto": [("name", 1, "string", False), ("size", 2, "int64", False)],
    "AxisRefProto": [
        ("mesh_axis_index", 1, "int64", False),
        ("sub_axis_info", 2, "SubAxisProto", False),
    ],
    "SubAxisProto": [("pre_size", 1, "int64", False), ("size", 2, "int64", False)],
    "CollectiveDeviceListProto": [
        ("replica_groups", 1, "ReplicaGroup", True),
        ("iota_replica_group_list", 2, "IotaReplicaGroupListProto", False),
    ],
    "OpSharding": [
        ("type", 1, "int32", False),
        ("tile_assignment_dimensions", 3, "int64", True),
        ("tile_assignment_devices", 4, "int64", True),
        ("tuple_shardings", 5, "OpSharding", True),
        ("replicate_on_last_tile_dim", 6, "bool", False),
    ],
    "DeviceAssignmentProto": [
        ("replica_count", 1, "int32", False),
        ("computation_count", 2, "int32", False),
        ("computation_devices", 3, "ComputationDevice", True),
    ],
    "ComputationDevice": [("replica_device_ids", 1, "int64", True)],
    "FrontendAttributes": [("map", 1, "FrontendAttributes.MapEntry", True)],
}

_SCALAR_TYPES = {
    "string": descriptor_pb2.FieldDescriptorProto.TYPE_STRING,
    "int64": descriptor_pb2.FieldDescriptorProto.TYPE_INT64,
    "int32": descriptor_pb2.FieldDescriptorProto.TYPE_INT32,
    "bool": descriptor_pb2.FieldDescriptorProto.TYPE_BOOL,
    "float": descriptor_pb2.FieldDescriptorProto.TYPE_FLOAT,
    "bytes": descriptor_pb2.FieldDescriptorProto.TYPE_BYTES,
}


def _add_field(message, name: str, number: int, type_name: str, repeated: bool) -> None:
    field = message.field.add(name=name, number=number)
    field.label = (
        descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED
        if repeated
        else descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL
    )
    if type_name in _SCALAR_TYPES:
        field.type = _SCALAR_TYPES[type_name]
    else:
        field.type = descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE
        field.type_name = f".{_PACKAGE}.{type_name}"


def _build_classes() -> dict[str, type]:
    file_proto = descriptor_pb2.FileDescriptorProto(
        name="disco_xla/hlo_subset.proto", package=_PACKAGE, syntax="proto3"
    )
    for message_name, fields in _MESSAGES.items():
        message = file_proto.message_type.add(name=message_name)
        for name, number, type_name, repeated in fields:
            _add_field(message, name, number, type_name, repeated)
        if message_name == "FrontendAttributes":
            entry = message.nested_type.add(name="MapEntry")
            entry.options.map_entry = True
            _add_field(entry, "key", 1, "string", False)
            _add_field(entry, "value", 2, "string", False)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file_proto)
    return {
        name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{_PACKAGE}.{name}"))
        for name in _MESSAGES
    }


_CLASSES = _build_classes()

HloProto = _CLASSES["HloProto"]
HloModuleProto = _CLASSES["HloModuleProto"]
HloComputationProto = _CLASSES["HloComputationProto"]
HloInstructionProto = _CLASSES["HloInstructionProto"]
ShapeProto = _CLASSES["ShapeProto"]
OpSharding = _CLASSES["OpSharding"]
