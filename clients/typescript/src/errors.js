// Errors: one class per kind of the control protocol (docs/control-protocol.md).

/** An error answered by the daemon: `kind`, `message` (the daemon's), `hint` (null when
 * none), and `exitCode` (the command line's for the kind). */
export class CowspaceError extends Error {
  static kind = 'io';
  static exitCode = 1;
  constructor(message, hint = null, kind = undefined) {
    const k = kind ?? new.target.kind;
    super(message);
    this.name = new.target.name;
    this.kind = k;
    this.hint = hint ?? null;
    this.exitCode = new.target.exitCode;
  }
}

export class IoError extends CowspaceError { static kind = 'io'; static exitCode = 1; }
export class NotFound extends CowspaceError { static kind = 'not_found'; static exitCode = 3; }
export class Exists extends CowspaceError { static kind = 'exists'; static exitCode = 4; }
export class Busy extends CowspaceError { static kind = 'busy'; static exitCode = 5; }
export class Conflict extends CowspaceError { static kind = 'conflict'; static exitCode = 6; }
export class Unsupported extends CowspaceError { static kind = 'unsupported'; static exitCode = 7; }
export class Corrupt extends CowspaceError { static kind = 'corrupt'; static exitCode = 8; }
export class InvalidInput extends CowspaceError { static kind = 'invalid_input'; static exitCode = 9; }

/** The daemon speaks another control protocol than this client (both are named). */
export class IncompatibleDaemon extends Unsupported {
  constructor(client, daemon, version, path) {
    super(
      `the daemon at ${path} speaks control protocol ${daemon} (cowspace ${version}); ` +
        `this client speaks protocol ${client}`,
      'install the client released with that daemon, or upgrade the daemon',
    );
    this.clientProtocol = client;
    this.daemonProtocol = daemon;
    this.daemonVersion = version;
  }
}

/** A command ran past its timeout: `result` holds what it wrote until then. */
export class ExecTimeoutError extends Error {
  constructor(timeoutMs, result) {
    super(`the command did not end within ${timeoutMs} ms`);
    this.name = 'ExecTimeoutError';
    this.timeoutMs = timeoutMs;
    this.result = result;
  }
}

/** `check: true` and the command exited with a status other than 0. */
export class CommandFailed extends Error {
  constructor(result) {
    const tail = result.stderr.trim().slice(-500);
    super(`the command exited with status ${result.exitCode}${tail ? `: ${tail}` : ''}`);
    this.name = 'CommandFailed';
    this.result = result;
  }
}

const BY_KIND = Object.fromEntries(
  [IoError, NotFound, Exists, Busy, Conflict, Unsupported, Corrupt, InvalidInput].map((c) => [c.kind, c]),
);

/** The error for an answered `{kind, message, hint}`. */
export function errorFrom(body) {
  const b = body ?? {};
  const kind = String(b.kind ?? 'io');
  const cls = BY_KIND[kind];
  const message = String(b.message ?? '');
  return cls ? new cls(message, b.hint ?? null) : new CowspaceError(message, b.hint ?? null, kind);
}
