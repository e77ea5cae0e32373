// SelfBind is a JDK HttpServer as its docs write it: it binds its own port
// ($PORT, the wildcard address) and stops on SIGTERM through a shutdown
// hook. deployd answers its bind with the agent's socket (handoff/bindtrap).
// Its answer names its version (APP_VERSION), pid and slot as the load
// generator expects.
import com.sun.net.httpserver.HttpServer;
import java.io.OutputStream;
import java.net.InetSocketAddress;
import java.nio.charset.StandardCharsets;

public class SelfBind {
    public static void main(String[] args) throws Exception {
        int port = Integer.parseInt(System.getenv("PORT"));
        String body = "version=" + System.getenv("APP_VERSION") + " pid=" + ProcessHandle.current().pid()
                + " slot=" + System.getenv("DEPLOYD_WORKER") + "\n";
        byte[] out = body.getBytes(StandardCharsets.UTF_8);
        HttpServer server = HttpServer.create(new InetSocketAddress(port), 0);
        server.createContext("/", ex -> {
            ex.sendResponseHeaders(200, out.length);
            try (OutputStream os = ex.getResponseBody()) {
                os.write(out);
            }
        });
        Runtime.getRuntime().addShutdownHook(new Thread(() -> server.stop(1)));
        server.start();
        System.out.println("listening on :" + port);
    }
}
