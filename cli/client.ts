/**
 * lessorctl's HTTP client: every command is one or a few calls to Lessor's JSON API. An error
 * answer becomes an `ApiError` carrying the API's stable code and message, which the entry point
 * prints and exits non-zero on.
 */

/** An answer of Lessor that was not a success, or no answer at all. */
export class ApiError extends Error {
  override readonly name = "ApiError";
  /** The API's stable code (`tenant_not_found`, …), or lessorctl's own for transport failures. */
  readonly code: string;
  /** The HTTP status; 0 when Lessor could not be reached. */
  readonly status: number;

  constructor(code: string, message: string, status: number) {
    super(message);
    this.code = code;
    this.status = status;
  }
}

/** How the client reaches Lessor. `fetch` is injectable so tests drive the CLI without a server. */
export interface ClientOptions {
  url: string;
  adminKey: string | undefined;
  fetch: typeof fetch;
  /** The region every call is for (`?region=`, docs/adr/023-regions.md); null: the default region. */
  region?: string | null;
}

/** A request: which key to send (the admin key unless a tenant key is given), and a JSON body. */
export interface CallOptions {
  key?: string;
  body?: unknown;
  /** Statuses other than 2xx that are an answer, not an error. */
  accept?: readonly number[];
}

export class LessorClient {
  private readonly options: ClientOptions;

  constructor(options: ClientOptions) {
    this.options = options;
  }

  get url(): string {
    return this.options.url;
  }

  /** Calls the API and returns the parsed JSON body (null for an empty body). */
  async call<T>(method: string, path: string, call: CallOptions = {}): Promise<T> {
    const key = call.key ?? this.options.adminKey;
    if (!key) {
      throw new ApiError(
        "missing_admin_key",
        "No admin key: set LESSOR_ADMIN_KEY or pass --admin-key (npm start prints it).",
        0,
      );
    }
    const headers: Record<string, string> = { Authorization: `Bearer ${key}` };
    if (call.body !== undefined) headers["content-type"] = "application/json";
    let response: Response;
    try {
      const target = new URL(path, this.options.url);
      // A tenant's own key names its region itself; the operator's calls say which region they are for.
      if (this.options.region && !target.searchParams.has("region")) {
        target.searchParams.set("region", this.options.region);
      }
      response = await this.options.fetch(target, {
        method,
        headers,
        ...(call.body === undefined ? {} : { body: JSON.stringify(call.body) }),
      });
    } catch (error) {
      const cause = error instanceof Error && error.cause instanceof Error ? `: ${error.cause.message}` : "";
      throw new ApiError("unreachable", `Could not reach Lessor at ${this.options.url}${cause}.`, 0);
    }
    const text = await response.text();
    const body = parseJson(text);
    if (response.ok || call.accept?.includes(response.status)) return body as T;
    if (isErrorBody(body)) throw new ApiError(body.code, body.message, response.status);
    throw new ApiError(
      "unexpected_answer",
      `HTTP ${response.status}: ${text.slice(0, 200)}`,
      response.status,
    );
  }
}

function parseJson(text: string): unknown {
  if (text === "") return null;
  try {
    return JSON.parse(text) as unknown;
  } catch {
    return text;
  }
}

function isErrorBody(body: unknown): body is { code: string; message: string } {
  return (
    typeof body === "object" &&
    body !== null &&
    typeof (body as { code?: unknown }).code === "string" &&
    typeof (body as { message?: unknown }).message === "string"
  );
}
