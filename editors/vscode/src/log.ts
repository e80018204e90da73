/**
 * The server's stderr, line by line, into the output channel at each line's own level. The
 * server writes `DATE TIME LEVEL logger: message` (Python's logging); vscode-languageclient
 * would file every stderr line as an error. No `vscode` import: the tests feed it plain lines.
 */

export type Level = 'trace' | 'debug' | 'info' | 'warn' | 'error';

const LEVELS: Record<string, Level> = {
  TRACE: 'trace',
  DEBUG: 'debug',
  INFO: 'info',
  WARN: 'warn',
  WARNING: 'warn',
  ERROR: 'error',
  CRITICAL: 'error',
  FATAL: 'error',
};

// The level is one of the first few words (after the time stamp), bare or in brackets.
const LEVEL_WORD = /^(?:\S+\s+){0,3}?\[?(TRACE|DEBUG|INFO|WARN|WARNING|ERROR|CRITICAL|FATAL)\]?[\s:]/;

/**
 * The level of each line. A line with no level of its own (a traceback's body) keeps the level
 * of the line before it; before any, `info`.
 */
export class LevelReader {
  private last: Level = 'info';

  level(line: string): Level {
    const m = LEVEL_WORD.exec(line);
    if (m) this.last = LEVELS[m[1]];
    return this.last;
  }
}

/** The subset of vscode.LogOutputChannel the reader writes to. */
export type LogSink = Record<Level, (message: string) => void>;

/** Write one stderr line to `sink` at its level. */
export function logLine(reader: LevelReader, sink: LogSink, line: string): void {
  sink[reader.level(line)](line);
}
