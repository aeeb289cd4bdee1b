"""Generated protobuf code for the Tether Responses protocol (see proto/)."""
