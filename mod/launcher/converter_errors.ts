/**
 * Errors of the VMI -> domain conversion. Every message names the VMI and, where there
 * is one, the JSON path of the field at fault, so the user can find it in the manifest.
 *
 * @module
 */

/** Base class: the conversion of a VMI failed. */
export class ConversionError extends Error {
  /** `namespace/name` of the VMI. */
  readonly vmiKey: string;
  /** Creates the error; `detail` follows `Cannot convert VMI "<key>": `. */
  constructor(vmiKey: string, detail: string, options?: ErrorOptions) {
    super(`Cannot convert VMI "${vmiKey}": ${detail}`, options);
    this.name = "ConversionError";
    this.vmiKey = vmiKey;
  }
}

/** A field, or a value of a field, that virtnode does not support yet. */
export class UnsupportedFieldError extends ConversionError {
  /** JSON path of the field, e.g. `spec.domain.devices.gpus`. */
  readonly path: string;
  /** Creates the error; `detail` says what about the field is not supported. */
  constructor(vmiKey: string, path: string, detail?: string, options?: ErrorOptions) {
    super(vmiKey, `unsupported field "${path}"${detail ? `: ${detail}` : ""}`, options);
    this.name = "UnsupportedFieldError";
    this.path = path;
  }
}

/** A field whose value is malformed or not allowed (wrong type, unsafe path, ...). */
export class InvalidFieldError extends ConversionError {
  /** JSON path of the field, e.g. `spec.volumes[0].hostDisk.path`. */
  readonly path: string;
  /** Creates the error; `detail` says what is wrong with the value. */
  constructor(vmiKey: string, path: string, detail: string, options?: ErrorOptions) {
    super(vmiKey, `invalid field "${path}": ${detail}`, options);
    this.name = "InvalidFieldError";
    this.path = path;
  }
}

/** Preparing a volume's backing file failed (qemu-img, ISO tool, file system). */
export class VolumePreparationError extends ConversionError {
  /** JSON path of the volume, e.g. `spec.volumes[1]`. */
  readonly path: string;
  /** Creates the error; `detail` names the failed step; `cause` carries the reason. */
  constructor(vmiKey: string, path: string, detail: string, options?: ErrorOptions) {
    super(vmiKey, `cannot prepare volume "${path}": ${detail}`, options);
    this.name = "VolumePreparationError";
    this.path = path;
  }
}
